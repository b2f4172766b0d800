"""Properties of any request a user may send, within stated bounds, through the target's engine.

Requests are drawn by :func:`harness.inputs.strategies.media_requests` and
:func:`~harness.inputs.strategies.embedding_requests` within
:data:`harness.inputs.strategies.REQUEST_BOUNDS` (images 1-4 of 8-2,048 px per side, videos of 1-16
frames of 8-128 px per side sampled from clips of 0.5-120 s at 2, 24000/1001, 25, 30000/1001 or 60
fps, audio of 0.1-70 s, embeddings 1-5 items of 1-64 rows, placeholders in any order). For
each: every item comes back once (nothing dropped), in the prompt's placeholder order, with as
many embedding rows as positions its placeholder expanded to; given embeddings come back
bit-exact. Embeddings of a bad shape are refused with a clear error naming them.

The number of examples follows the hypothesis profile (``REQUEST_EXAMPLES``: default 10, dev 4,
fuzz 1000), sized to each profile's time budget.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.inputs.media import embedding_rows
from harness.inputs.requests import PLACEHOLDER, Request
from harness.inputs.strategies import REQUEST_BOUNDS, embedding_requests, media_requests
from harness.oracles.assertions import raises_clear_error
from harness.plugin.hypothesis import REQUEST_EXAMPLES
from suites.conformance.test_requests import (
    MODALITIES,
    _batches_are_well_formed,
    _items_and_rows_agree,
)

pytestmark = pytest.mark.concern("requests")

#: A factory fixture (the model is built once per target and variant), not per-example state.
REQUEST_SETTINGS = settings(
    max_examples=REQUEST_EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def placeholder_order(prompt: str) -> list[str]:
    """The modalities of the prompt's placeholders, in prompt order."""
    marks = {text: modality for modality, text in PLACEHOLDER.items()}
    found = []
    for index in range(len(prompt)):
        for text, modality in marks.items():
            if prompt.startswith(text, index):
                found.append(modality)
    return found


def _embedded_whole_and_in_order(model, request) -> None:
    result = model.run_request(request)
    _items_and_rows_agree(request, result, model.spec.hidden_size)
    _batches_are_well_formed(result)
    got = [item.modality for item in result.items]
    assert got == placeholder_order(request.prompt), (
        f"items in the order {got}, placeholders in the order {placeholder_order(request.prompt)}"
    )
    for modality in MODALITIES:
        for index, expected in enumerate(request.embeddings(modality) or []):
            _, embedding = result.item(modality, index)
            assert torch.equal(embedding, expected), f"{modality}[{index}]: not the given rows"


@REQUEST_SETTINGS
@given(data=st.data())
def test_any_media_request_within_bounds_is_embedded_whole_and_in_order(make_model, data):
    model = make_model()
    _embedded_whole_and_in_order(model, data.draw(media_requests(model.spec), label="request"))


@pytest.mark.parametrize("modality", ["image", "video"])
@REQUEST_SETTINGS
@given(data=st.data())
def test_any_embeddings_request_within_bounds_is_returned_whole_and_in_order(
    make_model, modality, data
):
    model = make_model()
    request = data.draw(embedding_requests(model.spec, modality), label="request")
    _embedded_whole_and_in_order(model, request)


#: Shapes an embedding item must not have, from its row count and the hidden size h.
BAD_SHAPES = {
    "too-wide": lambda rows, h: (rows, h + 1),
    "too-narrow": lambda rows, h: (rows, h - 1),
    "rank-1": lambda rows, h: (rows * h,),
    "rank-3": lambda rows, h: (1, rows, h),
}


@pytest.mark.parametrize("shape", sorted(BAD_SHAPES))
@pytest.mark.parametrize("modality", ["image", "video"])
@REQUEST_SETTINGS
@given(data=st.data())
def test_embeddings_of_a_bad_shape_are_refused_naming_them(make_model, modality, shape, data):
    model = make_model()
    h = model.spec.hidden_size
    n = data.draw(st.integers(*REQUEST_BOUNDS.embedding_items), label="items")
    rows = data.draw(st.integers(*REQUEST_BOUNDS.embedding_rows), label="rows")
    bad = data.draw(st.integers(0, n - 1), label="bad item")
    items = [embedding_rows(rows, h, i) for i in range(n)]
    items[bad] = torch.zeros(BAD_SHAPES[shape](rows, h))
    request = Request(" ".join([PLACEHOLDER[modality]] * n), **{modality + "s": items})
    with raises_clear_error(f"{modality}_embeds", f"{modality.capitalize()} embedding", modality):
        model.run_request(request)
