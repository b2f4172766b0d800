"""A known deviation excuses only its own bug: a drawn request (a property check, a covering-array
variant) is excused only by a deviation that names the request shape its bug reaches, and a
check's several problems only when the pinned cause matches each one. Each mechanism is shown
both ways: the generic cause that passed before, and the seeded bug that fails now."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.checkpoints.spec import ModelSpec
from harness.inputs.media import pil_image
from harness.inputs.requests import Request
from harness.inputs.shapes import REQUEST_SHAPES, request_has_shape
from harness.jobs.deviations import (
    Deviation,
    deviations_path,
    explained_by,
    load_deviations,
)
from harness.model_files import MODEL_FILE, write_mutated_copy
from harness.problems import Problems, assert_no_problems
from suites.harness.helpers import needs_vllm, run_suites

VLLM_PINS = list(load_deviations(deviations_path("vllm")).values())
#: Causes many bugs share: a bare ``assert``, a division by zero, an index past a list's end.
GENERIC_FAILURES = (
    AssertionError(),
    ZeroDivisionError("division by zero"),
    IndexError("list index out of range"),
)
PLAIN_REQUEST = Request("Describe <image>.", images=[pil_image(64, 64, 1)])


@pytest.mark.parametrize("failure", GENERIC_FAILURES, ids=lambda e: type(e).__name__)
def test_a_generic_cause_of_a_drawn_request_is_no_pinned_deviations(
    failure: BaseException,
) -> None:
    # Before: some pinned deviation's cause is this failure, so any drawn request that met it
    # passed as that deviation's.
    matching = [d.check for d in VLLM_PINS if d.cause_of(failure) is None]
    assert matching, f"no pinned deviation's cause is {failure!r}: the case shows nothing"
    # Now: none of them names the shape of a plain image request, so the check fails.
    assert explained_by(failure, VLLM_PINS, PLAIN_REQUEST, ModelSpec()) is None


def pin(match: str, drawn: str | None = None) -> Deviation:
    return Deviation("suites/x.py::test_pinned", "why", "AssertionError", match, "request", drawn)


def test_a_deviation_excuses_a_drawn_request_only_of_the_shape_it_names() -> None:
    embeds = Request("<image>", images=[pil_image(64, 64, 1)])
    failure = TypeError("int() argument must be a string, a bytes-like object or a real number")
    typed = Deviation("suites/x.py::test_embeds", "why", "TypeError", "^int", "request", None)
    assert explained_by(failure, [typed], embeds, ModelSpec()) is None  # no shape named
    shaped = Deviation(
        "suites/x.py::test_embeds", "why", "TypeError", "^int", "request", "image-embeddings"
    )
    assert explained_by(failure, [shaped], embeds, ModelSpec()) is None  # pixels, not embeds
    import torch

    given = Request("<image>", images=[torch.zeros(4, 64)])
    assert request_has_shape("image-embeddings", given, ModelSpec())
    assert explained_by(failure, [shaped], given, ModelSpec()) == "suites/x.py::test_embeds"


#: The server's LoRA check whose pin matched one request's problem among several.
IN_FLIGHT = (
    "suites/server/test_lora.py::test_adapter_and_base_requests_in_flight_together_answer_as_alone"
)


def test_one_matching_problem_no_longer_excuses_the_others() -> None:
    # The pin as it was before it was anchored (it is anchored now, and checked per problem).
    adapter_none = pin(r"\(text, adapter None\): (greedy token \d+|log-probabilities differ)")
    committed = load_deviations(deviations_path("vllm-engine"))[IN_FLIGHT]
    problems = [
        "request 1 (text, adapter None): log-probabilities differ by up to 0.4 nats",
        "request 0 (text, lm-projections): greedy token 2: 5 against 7",  # cross-talk
    ]
    # Before: the problems joined into one message, which the pattern matched.
    joined = AssertionError("together against alone: " + "; ".join(problems))
    assert adapter_none.cause_of(joined) is None
    # Now: each problem on its own, and the cross-talk is not the pinned bug.
    with pytest.raises(Problems) as raised:
        assert_no_problems(problems, "together against alone: ")
    assert adapter_none.cause_of(raised.value) is not None
    assert adapter_none.cause_of(Problems("together against alone: ", problems[:1])) is None
    # The committed pin: the no-adapter request's problem alone is the bug, not the cross-talk.
    assert committed.cause_of(Problems("together against alone: ", problems[:1])) is None
    assert committed.cause_of(raised.value) is not None
    assert committed.cause_of(joined) is not None  # anchored: one message of two problems
    with pytest.raises(ValueError, match="expected at least one"):
        Problems("header: ", [])


def test_every_shape_a_deviation_names_is_known_and_holds_for_its_own_kind_of_request() -> None:
    named = {d.drawn for d in VLLM_PINS if d.drawn is not None}
    assert named <= set(REQUEST_SHAPES)
    assert named, "no committed deviation names a request shape"
    fp32 = ModelSpec(checkpoint_dtype="float32")
    assert request_has_shape("media-on-a-float32-checkpoint", PLAIN_REQUEST, fp32)
    assert not request_has_shape("media-on-a-float32-checkpoint", PLAIN_REQUEST, ModelSpec())
    dynamic = ModelSpec(dynamic_resolution=True)
    assert request_has_shape("images-after-text-at-dynamic-resolution", PLAIN_REQUEST, dynamic)
    assert not request_has_shape(
        "images-after-text-at-dynamic-resolution",
        Request("<image>", images=[pil_image(9, 9, 1)]),
        dynamic,
    )
    with pytest.raises(ValueError, match="request shapes: name: expected one of"):
        request_has_shape("nope", PLAIN_REQUEST, ModelSpec())


#: vLLM's audio path, where a bare ``assert`` is seeded.
AUDIO_ANCHOR = (
    "        assert self.sound_encoder is not None\n"
    "        input_audio_features = audio_input.input_audio_features\n"
)
AUDIO_PROPERTY = "test_any_audio_near_a_clip_boundary_is_cut_as_the_reference_cuts_it"


@needs_vllm
def test_a_bare_assert_seeded_in_vllms_audio_path_fails_the_drawn_audio_check(
    tmp_path: Path,
) -> None:
    """The property check draws audio requests; a bare ``assert`` on vLLM's audio path raises
    ``AssertionError()``, the cause two pinned ``test_none_values_are_ignored`` entries share.
    It was excused as theirs; it fails now."""

    def seed(source: str) -> str:
        assert source.count(AUDIO_ANCHOR) == 1
        return source.replace(
            AUDIO_ANCHOR, AUDIO_ANCHOR + "        assert audio_input.audio_num_clips is None\n", 1
        )

    mutant = write_mutated_copy(MODEL_FILE, tmp_path / "src", seed)
    run = run_suites(
        tmp_path / "run",
        f"--target=vllm-file:{mutant}",
        "-k",
        AUDIO_PROPERTY,
        suite="suites/conformance/test_parity.py",
    )
    result = run.outcome(f"suites/conformance/test_parity.py::{AUDIO_PROPERTY}")
    assert result["outcome"] == "fail", result
    assert "AssertionError" in result["reason"], result
