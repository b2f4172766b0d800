"""EVS video pruning (``video_pruning_rate``) through the target's engine.

With a rate ``q`` in ``[0, 1)`` a video of ``g`` groups (frames, or tubelets of ``T`` frames) of
``k`` tokens keeps ``max(k, floor(g * k * (1 - q)))`` of them: its first group whole, then the
tokens that changed most since the previous group (``1 - cos``). What every target must do:

- the video's placeholder holds exactly that many context tokens (the processor sizes it before
  any pixel is embedded), and the model fills every position of it;
- the kept tokens are the ones that changed: the EVS request forms repeat frames (a repeated
  frame changes nothing) and choose their rates so that the kept tokens are whole groups, known
  from the frames alone; each group's kept count sits between its own ``<img>`` and ``</img>``;
- any video (hypothesis: 1-16 frames of any size, two rates, both temporal patch sizes) gets
  that count, and as many embedding rows as placeholder positions;
- a rate outside ``[0, 1)`` is refused when the model is built, with an error naming it.

Parity with the reference on the same forms (kept rows within the request-path tolerance,
separator rows exact) is in ``test_parity.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.checkpoints.cache import checkpoint_weights
from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.media import video_clip
from harness.inputs.requests import Request, VideoClip
from harness.oracles.assertions import raises_clear_error
from harness.oracles.rows import EMBEDDING_TABLE
from reference_impl.tokenizer import IMG_CONTEXT, IMG_END, IMG_START, shared_tokenizer
from suites.conformance.test_request_properties import REQUEST_SETTINGS

pytestmark = pytest.mark.concern("requests")

EVS_FORMS = [f.name for f in REQUEST_FORMS if f.spec.video_pruning_rate > 0]


def retained(k: int, groups: int, rate: float) -> int:
    """The architecture's kept-token count: ``max(k, floor(g * k * (1 - q)))``."""
    return max(k, int(groups * k * (1 - rate)))


def _token(text: str) -> int:
    ids = shared_tokenizer().encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text} is not one token"
    return int(ids[0])


def expected_groups(clip: VideoClip, t: int, k: int, rate: float) -> list[int]:
    """Each group's kept tokens, from the frames alone: the first group and every group whose
    frames differ from the previous group's are *changed* (all their tokens score far above a
    repeated group's 0). The form must keep exactly the changed groups, or the first alone."""
    groups = [clip.frames[i : i + t] for i in range(0, len(clip.frames), t)]
    changed = [0] + [
        i
        for i in range(1, len(groups))
        if groups[i].shape != groups[i - 1].shape or not np.array_equal(groups[i], groups[i - 1])
    ]
    whole, rest = divmod(retained(k, len(groups), rate), k)
    assert rest == 0, "the form's rate keeps part of a group: it cannot test this"
    assert whole in (1, len(changed)), "the form's rate keeps some changed groups: it cannot test"
    kept = changed[:whole]
    return [k if i in kept else 0 for i in range(len(groups))]


@pytest.mark.parametrize("form", EVS_FORMS)
def test_the_placeholder_holds_the_retained_count(request_runs, form):
    spec = FORMS_BY_NAME[form].spec
    request = FORMS_BY_NAME[form].request
    result = request_runs.run(form)
    context = _token(IMG_CONTEXT)
    t, k = spec.video_temporal_patch_size, spec.tokens_per_tile
    for item in result.items:
        clip = request.videos[item.index]
        groups = math.ceil(len(clip.frames) / t)
        count = sum(result.prompt_token_ids[p] == context for p in item.positions)
        expected = retained(k, groups, spec.video_pruning_rate)
        assert count == expected, (
            f"video[{item.index}]: {count} context tokens in its placeholder; {groups} groups of "
            f"{k} at rate {spec.video_pruning_rate} keep max({k}, floor({groups * k} * "
            f"(1 - {spec.video_pruning_rate}))) = {expected}"
        )


@pytest.mark.parametrize("form", EVS_FORMS)
def test_the_changed_groups_are_kept(request_runs, form):
    """Each group's rows between its ``<img>`` and ``</img>`` (the model's own layout, read
    from the rows that are those tags' token embeddings): ``k`` for a group that changed, 0
    for a repeated one."""
    spec = FORMS_BY_NAME[form].spec
    request = FORMS_BY_NAME[form].request
    result = request_runs.run(form)
    table = checkpoint_weights(spec)[EMBEDDING_TABLE]
    start, end = table[_token(IMG_START)], table[_token(IMG_END)]
    for item, rows in zip(result.items, result.embeddings, strict=True):
        rows = rows.to(table.dtype)
        starts = [i for i in range(len(rows)) if torch.equal(rows[i], start)]
        ends = [i for i in range(len(rows)) if torch.equal(rows[i], end)]
        assert len(starts) == len(ends), f"video[{item.index}]: unpaired <img> and </img> rows"
        got = [b - a - 1 for a, b in zip(starts, ends, strict=True)]
        clip = request.videos[item.index]
        expected = expected_groups(
            clip, spec.video_temporal_patch_size, spec.tokens_per_tile, spec.video_pruning_rate
        )
        assert got == expected, (
            f"video[{item.index}]: kept rows per group {got}, expected {expected} (the first "
            "group and the groups whose frames changed)"
        )


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, math.nan])
def test_a_rate_outside_zero_to_one_is_refused_naming_it(make_model, rate):
    with raises_clear_error("video_pruning_rate"):
        make_model(video_pruning_rate=rate)


#: Rates and temporal patch sizes of the property below (each pair is one model build).
PROPERTY_VARIANTS = [(0.3, 1), (0.9, 1), (0.3, 2), (0.9, 2)]


@pytest.mark.parametrize(
    ("rate", "t"), PROPERTY_VARIANTS, ids=[f"q{q}-t{t}" for q, t in PROPERTY_VARIANTS]
)
@REQUEST_SETTINGS
@given(
    frames=st.integers(1, 16),
    height=st.integers(8, 128),
    width=st.integers(8, 128),
    seed=st.integers(0, 2**16),
)
def test_any_pruned_video_keeps_the_retained_count(
    make_model, rate, t, frames, height, width, seed
):
    """Any video of 1-16 frames of any size: its placeholder holds the formula's count of
    context tokens (frames are resized to one tile: ``k`` tokens per group), and the model
    fills every position of it (which tokens are kept among near-equal scores may differ
    between targets; the counts may not)."""
    model = make_model(video_pruning_rate=rate, video_temporal_patch_size=t)
    request = Request("<video>", videos=[video_clip(frames, height, width, seed)])
    result = model.run_request(request)
    (item,) = result.items
    context = _token(IMG_CONTEXT)
    count = sum(result.prompt_token_ids[p] == context for p in item.positions)
    k = model.spec.tokens_per_tile
    expected = retained(k, math.ceil(frames / t), rate)
    assert count == expected, f"{frames} frames, T={t}, q={rate}: {count} kept, expected {expected}"
    assert result.embeddings[0].shape[0] == len(item.positions), (
        f"{frames} frames: {result.embeddings[0].shape[0]} rows for {len(item.positions)} positions"
    )
