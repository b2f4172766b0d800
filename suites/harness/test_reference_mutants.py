"""The suites bite on the reference too: each regression mutant of the reference implementation
(``--target reference-mutant:NAME``) fails exactly the checks of its bug class, for the right
reason; and the #38655 mutants of vLLM's file fail the state-shape and metadata checks."""

from __future__ import annotations

import pytest

from harness.targets.mutants import write_mutant
from suites.harness.helpers import needs_vllm, run_suites

C = "suites/conformance/"
W = f"{C}test_weight_loading.py::"

EXPECTED = {
    "deepcopy-live-config": (
        {
            f"{C}test_configs.py::test_state_shapes_match_the_reference_without_deep_copies"
            f"[{tp}-{name}]"
            for tp in (1, 2)
            for name in ("nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni")
        },
        "deep-copied",
    ),
    "processor-in-metadata": (
        {
            f"{C}test_metadata.py::test_answered_without_constructing_the_processor"
            f"[supports_video-{spec}]"
            for spec in ("static-audio", "dynamic-no-audio")
        }
        | {f"{C}test_concurrency.py::test_shared_tokenizer_under_32_threads"},
        "constructed the processor",
    ),
    "lora-wrapper-on-video-markers": (
        {f"{C}test_lora.py::test_video_marker_tokens_use_the_base_embedding[{t}]" for t in (1, 2)},
        "no mapping entry",
    ),
    "lora-metadata-drift": (
        {f"{C}test_lora.py::test_lora_metadata_equals_the_language_models[embedding_modules]"},
        "embedding_modules",
    ),
    "contract-accepts-wrong-shape": (
        {
            f"{C}test_contracts.py::test_invalid_inputs_are_rejected_naming_the_field[{case}]"
            for case in ("pixels-channels", "pixels-rank", "pixels-dtype")
        },
        "the call succeeded",
    ),
    "text-only-loads-tower-weights": (
        {f"{W}test_text_only_loads_the_language_model_and_never_reads_a_tower"},
        "text-only mode read",
    ),
    "weights-kept-by-reference": (
        {
            f"{W}test_streamed_weights_in_reused_buffers_load_the_same_values[{variant}]"
            for variant in ("default", "dynamic-t2")
        },
        "parameters differ",
    ),
}
#: Checks whose reason must also show the bug's effect, not only its cause: with a processor
#: built by a metadata call, the threads sharing the tokenizer get wrong (truncated) results.
RACE = f"{C}test_concurrency.py::test_shared_tokenizer_under_32_threads"
EFFECTS = {("processor-in-metadata", RACE): "results differ from the single-threaded ones"}
#: The suite that covers each mutant's class: the mutant runs it alone (the suites of other
#: classes do not see the mutated code paths).
SUITE_OF: dict[str, str | tuple[str, ...]] = {
    "deepcopy-live-config": f"{C}test_configs.py",
    "processor-in-metadata": (f"{C}test_concurrency.py", f"{C}test_metadata.py"),
    "lora-wrapper-on-video-markers": f"{C}test_lora.py",
    "lora-metadata-drift": f"{C}test_lora.py",
    "contract-accepts-wrong-shape": f"{C}test_contracts.py",
    "text-only-loads-tower-weights": f"{C}test_weight_loading.py",
    "weights-kept-by-reference": f"{C}test_weight_loading.py",
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(EXPECTED))
def test_reference_mutant_fails_its_checks(tmp_path, mutant):
    failing, reason = EXPECTED[mutant]
    run = run_suites(tmp_path, f"--target=reference-mutant:{mutant}", suite=SUITE_OF[mutant])
    assert run.returncode == 1, run.output[-3000:]
    assert run.outcomes("fail") == failing
    for check in failing:
        assert reason in run.outcome(check)["reason"], run.outcome(check)
        effect = EFFECTS.get((mutant, check))
        if effect is not None:
            assert effect in run.outcome(check)["reason"], run.outcome(check)


def test_unknown_reference_mutant_exits_2(tmp_path):
    run = run_suites(tmp_path, "--target=reference-mutant:nope", "--co")
    assert run.returncode == 2
    assert "reference-mutant: expected one of" in run.output


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("mutant", ["deepcopy-live-config", "processor-in-metadata"])
def test_vllm_38655_mutants_fail(tmp_path, mutant):
    """vLLM's file with #38655's bugs put back fails the checks the reference mutant of the same
    class fails, for the same reason; plus, for a processor built in ``supports_video``, the
    entry points that ask ``supports_video`` inside vLLM (the supported limits, the fields config,
    and max tokens per item, whose known deviations then fail for another reason: one more
    construction)."""
    failing, reason = EXPECTED[mutant]
    if mutant == "processor-in-metadata":
        failing = failing | {
            f"{C}test_metadata.py::test_answered_without_constructing_the_processor[{entry}-{spec}]"
            for entry in ("supported_limits", "routed_keys", "max_tokens_per_item")
            for spec in ("static-audio", "dynamic-no-audio")
        }
    path = write_mutant(mutant, tmp_path / "src")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}", suite=SUITE_OF[mutant])
    assert run.returncode == 1, run.output[-3000:]
    assert run.outcomes("fail") == failing
    for check in failing:
        assert reason in run.outcome(check)["reason"], run.outcome(check)
