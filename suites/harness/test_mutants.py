"""The suites bite: mutated copies of the installed vLLM model file fail them for the right
reason. Each mutant puts back one upstream bug (vLLM PRs #56398, #56231, #41205, #42244) and runs
as a vllm-file target, built and loaded by vLLM from the checkpoint folder."""

from __future__ import annotations

import pytest

from harness.targets.mutants import MUTATIONS, MutationError, write_mutant
from suites.harness.helpers import needs_vllm, run_suites

PASSTHROUGH = "suites/conformance/test_passthrough.py::"
ROUTING = "suites/conformance/test_routing.py::"
#: The suites of PR #56398's classes (the embedding path).
EMBEDDING_SUITES = ("suites/conformance/test_passthrough.py", "suites/conformance/test_routing.py")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm]

ORDERS = [
    "image_embeds-input_audio_features-pixel_values_flat_video",
    "image_embeds-pixel_values_flat_video-input_audio_features",
    "input_audio_features-image_embeds-pixel_values_flat_video",
    "input_audio_features-pixel_values_flat_video-image_embeds",
    "pixel_values_flat_video-image_embeds-input_audio_features",
    "pixel_values_flat_video-input_audio_features-image_embeds",
]
#: Every check that gives a stacked ``image_embeds`` tensor, and only those: they crash on its
#: truth value. The ones listed as known deviations fail "for another reason" than pinned.
WALRUS_CRASHES = {
    *(
        f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-stacked-image_embeds]"
        for n in (1, 2, 5)
    ),
    f"{PASSTHROUGH}test_embeddings_keep_their_dtype[image_embeds]",
    f"{PASSTHROUGH}test_embeddings_mixed_with_encoded_modalities[image_embeds]",
    f"{PASSTHROUGH}test_image_and_video_embeddings_together_keep_key_order[image-first]",
    f"{PASSTHROUGH}test_the_upstream_reproducer",
    f"{ROUTING}test_audio_position_set_by_any_audio_key",
    f"{ROUTING}test_each_form_reaches_its_modality[image_embeds]",
    f"{ROUTING}test_nothing_is_silently_dropped[core]",
    *(f"{ROUTING}test_output_order_follows_first_key[{order}]" for order in ORDERS),
}
WALRUS_OTHER_REASON = {
    f"{PASSTHROUGH}test_hidden_size_mismatch_rejected[stacked-image_embeds]",
    f"{PASSTHROUGH}test_none_values_are_ignored[video_embeds]",
    f"{PASSTHROUGH}test_row_count_mismatch_rejected_at_the_boundary[image_embeds]",
    f"{PASSTHROUGH}test_wrong_rank_rejected[image_embeds]",
    f"{ROUTING}test_both_forms_of_one_modality_are_not_silently_dropped[images]",
    f"{ROUTING}test_nothing_is_silently_dropped[none-keys]",
    f"{ROUTING}test_nothing_is_silently_dropped[ragged-lists]",
}
#: Every check that gives ``video_embeds`` and expects outputs from them: 0 outputs.
UNROUTED_DROPS = {
    *(
        f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-{form}-video_embeds]"
        for n in (1, 2, 5)
        for form in ("stacked", "list")
    ),
    f"{PASSTHROUGH}test_embeddings_keep_their_dtype[video_embeds]",
    f"{PASSTHROUGH}test_embeddings_mixed_with_encoded_modalities[video_embeds]",
    f"{PASSTHROUGH}test_image_and_video_embeddings_together_keep_key_order[image-first]",
    f"{PASSTHROUGH}test_image_and_video_embeddings_together_keep_key_order[video-first]",
    f"{PASSTHROUGH}test_the_upstream_reproducer",
    f"{ROUTING}test_each_form_reaches_its_modality[video_embeds]",
    f"{ROUTING}test_nothing_is_silently_dropped[core]",
}
UNROUTED_OTHER_REASON = {
    f"{PASSTHROUGH}test_ragged_embedding_lists_pass_through[video_embeds]",
    f"{PASSTHROUGH}test_wrong_rank_rejected[video_embeds]",
    f"{ROUTING}test_nothing_is_silently_dropped[none-keys]",
    f"{ROUTING}test_nothing_is_silently_dropped[ragged-lists]",
}


def test_walrus_truthiness_mutant_fails_on_stacked_image_embeds(tmp_path):
    path = write_mutant("image-embeds-walrus-truthiness", tmp_path / "src")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}", suite=EMBEDDING_SUITES)
    assert run.returncode == 1, run.output[-3000:]
    # The stacked tensor hits tensor truthiness: the exact upstream crash.
    for n in (1, 2, 5):
        failed = run.outcome(
            f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-stacked-image_embeds]"
        )
        assert failed["outcome"] == "fail"
        assert "Boolean value of Tensor with more than one value is ambiguous" in failed["reason"]
    assert run.outcome(f"{PASSTHROUGH}test_the_upstream_reproducer")["outcome"] == "fail"
    # A non-empty list is truthy: it "happened to work" upstream, and still does.
    for n in (1, 2, 5):
        assert (
            run.outcome(
                f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-list-image_embeds]"
            )["outcome"]
            == "pass"
        )
    # Video embeddings are untouched, and no known deviation flipped.
    for n in (1, 2, 5):
        for form in ("stacked", "list"):
            assert (
                run.outcome(
                    f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-{form}-video_embeds]"
                )["outcome"]
                == "pass"
            )
    assert run.outcomes("xpass") == set()
    # Exactly the checks of the class fail, each for its reason.
    assert run.outcomes("fail") == WALRUS_CRASHES | WALRUS_OTHER_REASON
    for check in WALRUS_CRASHES:
        assert "Boolean value of Tensor" in run.outcome(check)["reason"], check
    for check in WALRUS_OTHER_REASON:
        reason = run.outcome(check)["reason"]
        assert "known deviation failed for another reason" in reason, check
        assert "Boolean value of Tensor" in reason, check


def test_unrouted_video_embeds_mutant_drops_them_silently(tmp_path):
    path = write_mutant("video-embeds-not-routed", tmp_path / "src")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}", suite=EMBEDDING_SUITES)
    assert run.returncode == 1, run.output[-3000:]
    for n in (1, 2, 5):
        failed = run.outcome(
            f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-stacked-video_embeds]"
        )
        assert failed["outcome"] == "fail"
        assert f"expected {n} outputs, got 0" in failed["reason"]
    routed = run.outcome(f"{ROUTING}test_each_form_reaches_its_modality[video_embeds]")
    assert routed["outcome"] == "fail"
    assert "routed to []" in routed["reason"]
    assert run.outcome(f"{ROUTING}test_nothing_is_silently_dropped[core]")["outcome"] == "fail"
    # Image embeddings and video pixels are untouched.
    assert (
        run.outcome(f"{ROUTING}test_each_form_reaches_its_modality[image_embeds]")["outcome"]
        == "pass"
    )
    assert (
        run.outcome(f"{ROUTING}test_each_form_reaches_its_modality[pixel_values_flat_video]")[
            "outcome"
        ]
        == "pass"
    )
    # With video_embeds unrouted, `video_embeds=None` is ignored too: the one known deviation
    # this mutant "fixes", by accident.
    assert run.outcomes("xpass") == {f"{PASSTHROUGH}test_none_values_are_ignored[video_embeds]"}
    # Known deviations of video embeddings now fail for another reason than their pinned one.
    for check in (
        f"{PASSTHROUGH}test_ragged_embedding_lists_pass_through[video_embeds]",
        f"{PASSTHROUGH}test_wrong_rank_rejected[video_embeds]",
    ):
        failed = run.outcome(check)
        assert failed["outcome"] == "fail", failed
        assert "known deviation failed for another reason" in failed["reason"]
    # Exactly the checks that give video embeddings fail.
    assert run.outcomes("fail") == UNROUTED_DROPS | UNROUTED_OTHER_REASON
    for check in UNROUTED_OTHER_REASON:
        assert "known deviation failed for another reason" in run.outcome(check)["reason"]


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_applies_exactly_once(name, tmp_path):
    source = write_mutant(name, tmp_path).read_text()
    mutation = MUTATIONS[name]
    with pytest.raises(MutationError, match="found it 0 times"):
        mutation.apply(source)  # applied already: the pattern is gone


def test_lora_mutants_fail_the_lora_checks(tmp_path):
    """PR #56231's classes: the wrapper used for video marker tokens, drifted metadata."""
    wrapper = write_mutant("lora-wrapper-on-video-markers", tmp_path / "a")
    run = run_suites(
        tmp_path / "a", f"--target=vllm-file:{wrapper}", suite="suites/conformance/test_lora.py"
    )
    assert run.returncode == 1, run.output[-3000:]
    markers = {
        f"suites/conformance/test_lora.py::test_video_marker_tokens_use_the_base_embedding[{t}]"
        for t in (1, 2)
    }
    assert run.outcomes("fail") == markers
    for check in markers:
        assert "no mapping entry" in run.outcome(check)["reason"], run.outcome(check)
    drift = write_mutant("lora-metadata-drift", tmp_path / "b")
    run = run_suites(
        tmp_path / "b", f"--target=vllm-file:{drift}", suite="suites/conformance/test_lora.py"
    )
    assert run.returncode == 1, run.output[-3000:]
    drifted = (
        "suites/conformance/test_lora.py::"
        "test_lora_metadata_equals_the_language_models[embedding_modules]"
    )
    assert run.outcomes("fail") == {drifted}
    assert "input_embeddings" in run.outcome(drifted)["reason"], run.outcome(drifted)


WEIGHTS = "suites/conformance/test_weight_loading.py"


def test_text_only_mutant_reads_tower_weights(tmp_path):
    """PR #41205's class: every modality limit 0, and the tower weights are loaded anyway."""
    path = write_mutant("text-only-loads-tower-weights", tmp_path / "src")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}", suite=WEIGHTS)
    assert run.returncode == 1, run.output[-3000:]
    text_only = f"{WEIGHTS}::test_text_only_loads_the_language_model_and_never_reads_a_tower"
    assert run.outcomes("fail") == {text_only}, run.output[-3000:]
    # vLLM built no towers in text-only mode; loading their tensors anyway fails on the first
    # one the mutant lets through, looked up among parameters that do not exist.
    assert run.outcome(text_only)["reason"] == "KeyError: '0.weight'", run.outcome(text_only)


def test_buffer_aliasing_mutant_corrupts_streamed_tower_weights(tmp_path):
    """PR #42244's class: RADIO's tensors kept by reference; a loader that reuses its buffers
    overwrites them. A plain mapping still loads right; the streamed one does not."""
    path = write_mutant("tower-weights-kept-by-reference", tmp_path / "src")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}", suite=WEIGHTS)
    assert run.returncode == 1, run.output[-3000:]
    streamed = f"{WEIGHTS}::test_streamed_weights_in_reused_buffers_load_the_same_values"
    assert run.outcomes("fail") == {f"{streamed}[default]", f"{streamed}[dynamic-t2]"}
    for variant in ("default", "dynamic-t2"):
        reason = run.outcome(f"{streamed}[{variant}]")["reason"]
        assert "parameters differ: ['vision_model.model." in reason, reason
    plain = f"{WEIGHTS}::test_every_parameter_is_loaded_from_the_checkpoint[default]"
    assert run.outcome(plain)["outcome"] == "pass"
