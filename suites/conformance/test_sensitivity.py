"""Every path's output depends on its input: parity can see its bugs.

A parity check with bound ``b`` fails a bug only if the bug moves the rows by more than ``b``. If
two inputs that differ in content give rows that differ by less than ``b``, a front end that
threw the content away (a wrong window, a mel bank of zeros, an ignored mask) would pass parity;
that happened to the audio path of the earlier checkpoint folders, whose biases swamped the
signal in bf16 (``harness.oracles.parity``). Each path
(:data:`harness.inputs.catalogue.CONTENT_PAIRS`, and the connector on its own) gets two inputs of
the same shape and different content through the target's engine; the relative difference of their
rows must be at least :data:`~harness.oracles.parity.MIN_SENSITIVITY_RATIO` times the path's parity
bound on this target (the derived bound of :func:`harness.oracles.bounds.parity_bounds`, the
relative error over the item). The measured ratio goes into the report.
"""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.cache import checkpoint_weights
from harness.inputs.catalogue import CONTENT_PAIRS, PAIRS_BY_PATH
from harness.inputs.drawn import CONNECTOR_GRID, connector_features
from harness.inputs.requests import RequestResult
from harness.oracles.bounds import parity_bounds
from harness.oracles.parity import MIN_SENSITIVITY_RATIO, relative_error, table_rows
from harness.oracles.rows import EMBEDDING_TABLE

pytestmark = pytest.mark.concern("requests")


def computed_rows(result: RequestResult, modality: str, table: torch.Tensor) -> torch.Tensor:
    """The rows of ``result``'s ``modality`` items that a tower computed, all items stacked: a
    video's separator text rows (token embeddings, bit for bit rows of ``table``) left out."""
    rows = [
        e
        for item, e in zip(result.items, result.embeddings, strict=True)
        if item.modality == modality
    ]
    assert rows, f"no {modality} item in the result"
    stacked = torch.cat(rows)
    return stacked[~table_rows(stacked, table.to(stacked.device))]


def check_sensitivity(
    path: str, first: torch.Tensor, second: torch.Tensor, saved: str, record
) -> None:
    assert first.shape == second.shape, (
        f"{path}: the two inputs gave rows of shapes {tuple(first.shape)} and "
        f"{tuple(second.shape)}; the pair must differ in content only"
    )
    bound = parity_bounds(path, first.dtype, saved)["global"].value
    difference = relative_error(second, first)
    ratio = difference / bound
    record(
        "measured",
        {
            path: {
                "kind": "sensitivity",
                "dtype": str(first.dtype).removeprefix("torch."),
                "difference": float(f"{difference:.3g}"),
                "bound": bound,
                "ratio": float(f"{ratio:.3g}"),
                "minimum_ratio": MIN_SENSITIVITY_RATIO,
            }
        },
    )
    assert ratio >= MIN_SENSITIVITY_RATIO, (
        f"{path}: two inputs of different content give rows that differ by {difference:.3g} "
        f"(relative), {ratio:.3g}x the parity bound {bound:.3g} for {first.dtype}; at least "
        f"{MIN_SENSITIVITY_RATIO:g}x is needed, or parity cannot see a bug on this path"
    )


@pytest.mark.parametrize("path", [pair.path for pair in CONTENT_PAIRS])
def test_rows_depend_on_the_input(target, device, path, record_property):
    pair = PAIRS_BY_PATH[path]
    model = target.model(pair.spec, device)
    first, second = (model.run_request(request) for request in pair.requests)
    table = checkpoint_weights(pair.spec)[EMBEDDING_TABLE]
    check_sensitivity(
        path,
        computed_rows(first, pair.modality, table),
        computed_rows(second, pair.modality, table),
        pair.spec.checkpoint_dtype,
        record_property,
    )


@pytest.mark.concern("model")
def test_connector_rows_depend_on_its_input(make_model, record_property):
    model = make_model()
    first, second = connector_features(seed=50), connector_features(seed=52)
    check_sensitivity(
        "connector",
        model.connect(first, CONNECTOR_GRID),
        model.connect(second, CONNECTOR_GRID),
        "bfloat16",
        record_property,
    )
