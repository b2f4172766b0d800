"""Whole-model parity through the request path: the target against the reference.

For every catalogued request form, the target's processor and the reference's give the same
prompt token ids and placeholder positions, and the target's embeddings equal the reference's on
the same checkpoint folder (:func:`harness.oracles.rows.compare_with_reference`). The reference
runs in fp32:

- rows the target copies or looks up without arithmetic must be exact: precomputed embeddings,
  and a video's separator rows (the token embedding of its frame-separator text);
- rows the towers compute (vision, audio) are measured three ways (the relative error over the
  item, the largest per row, the largest per channel), each against its path's bound in the dtype
  the rows come in (:mod:`harness.oracles.bounds`): derived from vLLM's measured error against
  the reference over drawn weights and media (``nemotron-vl-calibrate``, committed under
  ``fixtures/calibration/``), never above the analytic ceiling (16 unit roundoffs: 6.25 % in
  bf16). vLLM builds the folder in bf16 and casts three times on top: pixels to ``config.dtype``,
  the ViT features before the norm and pixel shuffle, and Parakeet's output before the
  projection; measured 0.5 to 1.5 % on these folders, and the derived bounds sit a little above
  what each path measures, so a regression that moves a path by a few percent fails.

Drawn requests go through the same comparison: images a few pixels either side of a grid of
whole tiles, or of an extreme aspect ratio with a short side of 1 to 20 px, on each tiler
(static; dynamic; dynamic in a tight context); videos of any frame shape, odd and even counts,
source frame rates such as 24000/1001 whose frame duration is no whole number of milliseconds
(the frame separators carry each frame's timestamp, which the reference writes as the
checkpoint's processor does); audio around a clip boundary, at 16 kHz or at a rate vLLM's loader
resamples from. Each is compared by the prompt token for token, its features (pixel values,
log-mel features, masks; not a resampled clip's, see ``_served_as_the_reference``) and its rows
within their bounds; a failure a pinned deviation explains is that deviation's.

The connector alone (pixel shuffle and ``mlp1`` on the same vision features) is compared the same
way, so a connector bug is told apart from a tower's. The bounds mean something only where a
path's rows depend on its input: ``test_sensitivity.py`` checks that they do.

Each check records what it measured (``measured`` in the results), failing or not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.drawn import CONNECTOR_GRID, connector_features
from harness.inputs.requests import AUDIO_SAMPLE_RATE, Request, RequestResult, audio_with_rate
from harness.inputs.strategies import (
    REQUEST_BOUNDS,
    audio_requests,
    image_requests,
    video_requests,
)
from harness.jobs.deviations import Deviation, explained_by
from harness.oracles.bounds import error_statistics
from harness.oracles.features import compare_features
from harness.oracles.rows import ItemErrors, compare_with_reference, judge
from harness.plugin.target import RequestRuns
from harness.problems import assert_no_problems
from harness.targets.base import MultimodalModel
from reference_impl.tokenizer import shared_tokenizer
from suites.conformance.test_request_properties import REQUEST_SETTINGS

pytestmark = pytest.mark.concern("requests")


@pytest.mark.parametrize("form", [f.name for f in REQUEST_FORMS])
def test_request_matches_the_reference(request_runs, reference_runs, form, record_property):
    expected = reference_runs.run(form)
    actual = request_runs.run(form)
    catalogued = FORMS_BY_NAME[form]
    measured, problems = compare_with_reference(
        actual, expected, catalogued.request, catalogued.spec
    )
    record_property("measured", measured)
    assert_no_problems(problems)


def _served_as_the_reference(
    model: MultimodalModel,
    reference_runs: RequestRuns,
    request: Request,
    pinned: list[Deviation],
    record_property: pytest.RecordProperty,
) -> None:
    """``request`` (drawn) run by the target's model and by the reference on the same variant:
    the same prompt and positions (:func:`_same_prompt_and_positions`), the same features within
    their bounds (:func:`~harness.oracles.features.compare_features`: pixel values, log-mel
    features and masks) and rows within each path's bounds
    (:func:`~harness.oracles.rows.compare_with_reference`). A failure a pinned deviation of the
    target explains is that deviation's, recorded, not a new problem: one whose entry names the
    shape of the requests its bug reaches, which ``request`` has
    (:func:`~harness.jobs.deviations.explained_by`)."""
    reference = reference_runs.target.model(model.spec, torch.device("cpu"))
    expected = reference.run_request(request)
    try:
        actual = model.run_request(request)
    except Exception as e:
        known = explained_by(e, pinned, request, model.spec)
        if known is None:
            raise
        record_property("known deviation", known)
        return
    _same_prompt_and_positions(actual, expected)
    # A resampled clip's samples differ by the resamplers' float32 rounding (a few 1e-6 against
    # torchaudio's: suites/reference/test_resample.py), more than the log-mel features' elementwise
    # bound, set for the same samples, allows: its rows are compared, within the audio path's bound.
    resampled = {
        i for i, item in enumerate(request.audios) if audio_with_rate(item)[1] != AUDIO_SAMPLE_RATE
    }
    actual_features, expected_features = (
        [f for f in features if not (f.modality == "audio" and f.index in resampled)]
        for features in (model.request_features(request), reference.request_features(request))
    )
    _, problems = compare_features(actual_features, expected_features)
    _, found = compare_with_reference(
        actual, expected, request, model.spec, served=model.input_dtype
    )
    problems += found
    assert_no_problems(problems)


def _same_prompt_and_positions(actual: RequestResult, expected: RequestResult) -> None:
    """The target's processed prompt equals the reference's token for token (the message quotes
    the text where they part), and each item fills the same positions."""
    if actual.prompt_token_ids != expected.prompt_token_ids:
        tokenizer = shared_tokenizer()
        got, want = (tokenizer.decode(r.prompt_token_ids) for r in (actual, expected))
        first = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
            min(len(got), len(want)),
        )
        raise AssertionError(
            f"the prompt differs from the reference's from character {first}: "
            f"{got[max(0, first - 40) : first + 60]!r} vs {want[max(0, first - 40) : first + 60]!r}"
        )
    assert [i.positions for i in actual.items] == [i.positions for i in expected.items], (
        "the items fill other positions than the reference's"
    )


#: The tilers (spec fields, and the most text before the images): static tiles; dynamic patch
#: grids; dynamic in a 256-token context after up to 200 characters of text, where the images'
#: budget binds and is shared out among them.
TILERS: dict[str, tuple[dict[str, object], int]] = {
    "static": ({}, 0),
    "dynamic": ({"dynamic_resolution": True}, 0),
    "dynamic-256": ({"dynamic_resolution": True, "max_model_len": 256}, 200),
}


@pytest.mark.parametrize("tiler", list(TILERS))
@REQUEST_SETTINGS
@given(data=st.data())
def test_any_image_near_a_tiling_threshold_is_tiled_as_the_reference_tiles_it(
    make_model, reference_runs, pinned_deviations, record_property, tiler, data
):
    """Drawn images a few pixels either side of a grid of whole tiles, or of an extreme aspect
    ratio (:func:`~harness.inputs.strategies.image_requests`), on each tiler (:data:`TILERS`):
    the target's prompt (each image's token count, so its tile or patch grid) equals the
    reference's token for token."""
    fields, filler = TILERS[tiler]
    model = make_model(**fields)
    _served_as_the_reference(
        model,
        reference_runs,
        data.draw(image_requests(model.spec, filler)),
        pinned_deviations,
        record_property,
    )


#: Where drawn video frames go: a tile's square, or a grid of about 36 patches of the frame's
#: own aspect ratio (one video a request there: two of different shapes are the pinned
#: mixed-aspect finding).
FRAME_TARGETS = {
    "tile": ({}, REQUEST_BOUNDS),
    "aspect-36": (
        {"video_target_num_patches": 36, "video_maintain_aspect_ratio": True},
        dataclasses.replace(REQUEST_BOUNDS, videos=(1, 1)),
    ),
}


@REQUEST_SETTINGS
@given(data=st.data())
@pytest.mark.parametrize(("fields", "bounds"), FRAME_TARGETS.values(), ids=FRAME_TARGETS.keys())
def test_any_video_is_written_into_the_prompt_as_the_reference_writes_it(
    make_model, reference_runs, pinned_deviations, record_property, fields, bounds, data
):
    """Drawn videos (:func:`~harness.inputs.strategies.video_requests`: any frame shape, odd and
    even frame counts, source frame rates whose frame duration is no whole number of
    milliseconds, such as 24000/1001): the target's processed prompt, the frame separators'
    timestamps included, equals the reference's token for token, and each video fills the
    same positions. The reference writes each timestamp as the checkpoint's processor does
    (``suites/reference/test_video_text.py`` checks it against transformers' port of it)."""
    model = make_model(**fields)
    _served_as_the_reference(
        model,
        reference_runs,
        data.draw(video_requests(model.spec, bounds)),
        pinned_deviations,
        record_property,
    )


@REQUEST_SETTINGS
@given(data=st.data())
def test_any_audio_near_a_clip_boundary_is_cut_as_the_reference_cuts_it(
    make_model, reference_runs, pinned_deviations, record_property, data
):
    """Drawn audio a token's samples either side of 30 s or 60 s
    (:func:`~harness.inputs.strategies.audio_requests`), where vLLM cuts it into one more clip
    and its last clip gains a token: the target's prompt equals the reference's token for
    token."""
    model = make_model()
    _served_as_the_reference(
        model,
        reference_runs,
        data.draw(audio_requests(model.spec)),
        pinned_deviations,
        record_property,
    )


@pytest.mark.concern("model")
def test_connector_matches_the_reference(make_model, reference_runs, record_property):
    """Pixel shuffle and ``mlp1`` on the same vision features (bf16-representable, so every
    target starts from the same numbers) against the reference's connector."""
    features = connector_features(seed=51)
    got = make_model().connect(features, CONNECTOR_GRID)
    reference = reference_runs.target.model(ModelSpec(), torch.device("cpu"))
    want = reference.connect(features, CONNECTOR_GRID)
    assert got.shape == want.shape, (
        f"connector rows {tuple(got.shape)}, reference's {tuple(want.shape)}"
    )
    item = ItemErrors("connector", "connector", got.dtype, error_statistics(got, want), 0)
    judge(item, ModelSpec().checkpoint_dtype)
    record_property("measured", {"connector": item.measured()})
    assert not item.problems, "; ".join(item.problems)
