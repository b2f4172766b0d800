"""A target's run of a request against the reference's: which rows must be exact, which rows the
towers computed, and their error per statistic against the path's derived bounds.

One comparison for the parity checks (``suites/conformance/test_parity.py``, the served-dtype
checks) and for the calibration that derives their bounds (:mod:`harness.jobs.calibrate`), so
the numbers the bounds come from are measured exactly as the checks measure them.

- Rows the target copies or looks up without arithmetic must be exact: precomputed embeddings
  (in the dtype given or the served one), and a video's separator rows (the token embedding of
  its frame-separator text; the folder's weights are bf16, so fp32 and bf16 look-ups agree).
- Rows the towers compute are measured by each of :data:`harness.oracles.bounds.STATISTICS`
  against the bounds of the item's path (:func:`harness.oracles.bounds.parity_path`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch

from harness.checkpoints.cache import checkpoint_weights
from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import Request, RequestModality, RequestResult
from harness.oracles.bounds import (
    STATISTICS,
    CalibrationTable,
    CellBounds,
    Statistic,
    committed_table,
    dtype_name,
    error_statistics,
    parity_path,
)
from harness.oracles.parity import table_rows
from reference_impl.tokenizer import IMG_CONTEXT, shared_tokenizer

#: The checkpoint's token embedding table (the language model's ``embed_tokens``).
EMBEDDING_TABLE = "language_model.backbone.embeddings.weight"


@dataclass
class ItemErrors:
    """One item's tower rows measured against the reference's."""

    name: str  # "image[0]"
    path: str
    dtype: torch.dtype
    errors: dict[Statistic, float]
    separator_rows: int  # rows checked exact (a video's separator text)
    bounds: CellBounds | None = None
    problems: list[str] = field(default_factory=list)

    def measured(self) -> dict[str, object]:
        """What the results record for the item."""
        out: dict[str, object] = {
            "path": self.path,
            "dtype": dtype_name(self.dtype),
            "relative_error": round(self.errors["global"], 6),
            "separator_rows_exact": self.separator_rows,
        }
        for statistic in STATISTICS:
            out[f"{statistic}_error"] = float(f"{self.errors[statistic]:.4g}")
        if self.bounds is not None:
            out["bound"] = float(f"{self.bounds['global'].value:.4g}")
            for statistic in STATISTICS:
                out[f"{statistic}_bound"] = float(f"{self.bounds[statistic].value:.4g}")
            out["bound_source"] = self.bounds.source
            out["bound_method"] = self.bounds["global"].method
        return out


def measure_items(
    actual: RequestResult,
    expected: RequestResult,
    request: Request,
    spec: ModelSpec,
    *,
    served: torch.dtype | None = None,
    embedding_table: torch.Tensor | None = None,
) -> tuple[list[ItemErrors], dict[str, object]]:
    """``actual`` (a target's run of ``request`` on ``spec``'s folder, whose token embedding
    table is ``embedding_table``: by default the folder of ``spec`` the suites use) against the
    reference's run ``expected`` (fp32). Asserts what must be exact: the prompt, the
    placeholders, given embeddings, separator rows, the rows' shapes (and with ``served``, that
    the towers' rows come in it). Returns each tower item's errors, and what was measured of
    every item (given embeddings as ``{"exact": True}``)."""
    assert actual.prompt_token_ids == expected.prompt_token_ids, (
        f"prompt token ids differ from the reference's: {len(actual.prompt_token_ids)} vs "
        f"{len(expected.prompt_token_ids)} tokens"
    )
    assert actual.items == expected.items, "placeholder positions differ from the reference's"
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    measured: dict[str, object] = {}
    towers: list[ItemErrors] = []
    for item, got, want in zip(actual.items, actual.embeddings, expected.embeddings, strict=True):
        name = f"{item.modality}[{item.index}]"
        given = request.embeddings(cast(RequestModality, item.modality))
        if given is not None:
            assert got.dtype in (want.dtype, served), (
                f"{name}: the given embeddings came back in {got.dtype}, neither as given "
                f"({want.dtype}) nor in the served dtype ({served})"
            )
            assert torch.equal(got, want.to(got.dtype)), f"{name}: the given embeddings differ"
            measured[name] = {"exact": True}
            continue
        assert got.shape == want.shape, (
            f"{name}: rows shaped {tuple(got.shape)}, the reference's {tuple(want.shape)}"
        )
        if served is not None:
            assert got.dtype == served, (
                f"{name}: the towers' rows came in {got.dtype}, not the served dtype {served}"
            )
        tokens = torch.tensor([actual.prompt_token_ids[p] for p in item.positions])
        if item.modality != "video":
            computed = torch.ones_like(tokens, dtype=torch.bool)
        elif spec.video_pruning_rate == 0.0:
            computed = tokens == context
        else:
            # EVS: the prompt holds every kept token after the first separator (only the total
            # is known before embedding); the model lays each group's kept rows after its own.
            # The separator rows are then where the reference's rows are token embeddings.
            if embedding_table is None:
                embedding_table = checkpoint_weights(spec)[EMBEDDING_TABLE]
            computed = ~table_rows(want, embedding_table)
        text = ~computed
        if text.any():
            assert torch.equal(got[text], want[text].to(got.dtype)), (
                f"{name}: separator rows (token embeddings) differ from the reference's"
            )
        path = parity_path(spec, item.modality, audio_in_video=request.audio_in_video)
        errors = error_statistics(got[computed], want[computed])
        towers.append(ItemErrors(name, path, got.dtype, errors, int(text.sum())))
    return towers, measured


def judge(item: ItemErrors, saved: str, table: CalibrationTable | None = None) -> ItemErrors:
    """``item`` with its path's bounds (from ``table``, the committed one by default) and the
    statistics that exceed them."""
    item.bounds = (table or committed_table()).bounds(item.path, item.dtype, saved)
    for statistic in STATISTICS:
        bound, error = item.bounds[statistic].value, item.errors[statistic]
        if error > bound:
            what = "relative error" if statistic == "global" else f"largest {statistic} error"
            item.problems.append(
                f"{item.name}: {what} {error:.3g} against the reference, bound {bound:.3g} "
                f"for {item.path} in {item.dtype}"
            )
    return item


def compare_with_reference(
    actual: RequestResult,
    expected: RequestResult,
    request: Request,
    spec: ModelSpec,
    served: torch.dtype | None = None,
    table: CalibrationTable | None = None,
) -> tuple[dict[str, object], list[str]]:
    """What was measured of each item of ``actual`` against the reference's run ``expected``,
    and every bound the towers' rows exceed (:func:`measure_items`, then :func:`judge` with
    ``table``'s bounds, the committed calibration's by default)."""
    towers, measured = measure_items(actual, expected, request, spec, served=served)
    problems: list[str] = []
    for item in towers:
        judge(item, spec.checkpoint_dtype, table)
        measured[item.name] = item.measured()
        problems += item.problems
    return measured, problems
