"""EVS video pruning in the reference: the retained count, the selection rule, the processor's
placeholder and the model's pruning, against hand-computed values, against a video whose
repeated frames decide what is kept, and against vLLM's own EVS functions on the same inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from reference_impl import evs, presets
from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import IMG_CONTEXT, VOCAB_SIZE, shared_tokenizer
from reference_impl.video_replacement import video_replacement_ids
from suites.harness.helpers import needs_vllm

STATIC = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)  # T = 1
OMNI = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)  # T = 2

#: (tokens per group k, groups g, rate q) -> kept tokens, by hand: max(k, floor(g * k * (1 - q))).
RETAINED = [
    ((4, 6, 0.0), 24),  # no pruning
    ((4, 6, 0.5), 12),
    ((4, 4, 0.25), 12),
    ((256, 8, 0.7), 614),  # 2048 * 0.3 = 614.4
    ((4, 3, 0.99), 4),  # floor(0.12) = 0: never fewer than one group's
    ((4, 1, 0.9), 4),  # one frame: the first group is always kept whole
    ((16, 5, 0.95), 16),  # floor(4.0) = 4 < 16
]


@pytest.mark.parametrize(("args", "expected"), RETAINED)
def test_retained_count_follows_the_formula(args, expected):
    assert evs.retained_count(*args) == expected


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, math.nan, math.inf, "0.5", True])
def test_a_rate_outside_zero_to_one_is_rejected_naming_it(rate):
    with pytest.raises(
        ConfigError, match=r"'video_pruning_rate': expected a float in \[0, 1\), got"
    ):
        evs.retained_count(4, 2, rate)
    with pytest.raises(ConfigError, match="video_pruning_rate"):
        dataclasses.replace(STATIC, video_pruning_rate=rate)


def test_the_placeholder_puts_every_kept_token_after_the_first_separator():
    assert evs.placeholder_tokens_per_group(4, 3, 0.0) == [4, 4, 4]
    assert evs.placeholder_tokens_per_group(4, 3, 0.5) == [6, 0, 0]
    assert evs.placeholder_tokens_per_group(4, 1, 0.9) == [4]


def test_the_most_changed_tokens_are_kept_first_group_whole_ties_to_the_earlier():
    """Three groups of two tokens in 2-d: by hand, group 1 turns token 0 by 90 degrees (1 - cos
    = 1) and leaves token 1 (0); group 2 turns token 1 by 180 degrees (2) and leaves token 0
    (0). Keep 4 of 6: group 0 whole, then the scores 2 and 1; the two zeros go."""
    east, north, west = [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]
    groups = torch.tensor([[east, east], [north, east], [north, west]])
    assert evs.dissimilarity(groups)[1:].tolist() == [[1.0, 0.0], [0.0, 2.0]]
    mask = evs.retention_mask(groups, 0.3)  # floor(6 * 0.7) = 4
    assert mask.tolist() == [[True, True], [True, False], [False, True]]
    rows, per_group = evs.prune(groups, 0.3)
    assert per_group == [2, 1, 1]
    assert rows.tolist() == [east, east, north, west]  # kept rows in (t, j) order
    # Keep 5 (floor(6 * 0.84)): one of the two zeros goes with the others, the earlier one.
    assert evs.retention_mask(groups, 0.16).tolist() == [[True, True], [True, True], [False, True]]


def _model(config: VLConfig) -> NanoNemotronVLForConditionalGeneration:
    torch.manual_seed(0)
    return NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()


def _frames(pattern: str, side: int = 32) -> torch.Tensor:
    """``[F, side, side, 3]`` frames, one random image per distinct letter of ``pattern``."""
    images = {
        letter: torch.randint(
            0, 256, (side, side, 3), generator=torch.Generator().manual_seed(ord(letter))
        ).to(torch.uint8)
        for letter in set(pattern)
    }
    return torch.stack([images[letter] for letter in pattern])


@pytest.mark.parametrize(
    ("config", "pattern", "rate", "kept_groups"),
    [
        # T = 1: frames A B B C C C; 6 groups of 4, keep 12: A, the first B and the first C.
        (STATIC, "ABBCCC", 0.5, [0, 1, 3]),
        # T = 2: tubelets AA BB BB CC; 4 groups of 4, keep 12: tubelets 0, 1 and 3.
        (OMNI, "AABBBBCC", 0.25, [0, 1, 3]),
        # Near 1: keep one group's worth, the first.
        (STATIC, "ABCD", 0.95, [0]),
        # One frame: kept whole whatever the rate.
        (STATIC, "A", 0.9, [0]),
        (OMNI, "A", 0.9, [0]),
    ],
)
def test_the_model_keeps_the_groups_that_changed(config, pattern, rate, kept_groups):
    """Repeated frames embed identically (1 - cos = 0) and a new random frame moves every
    token: the kept tokens are whole groups, known by construction. The pruned video's rows at
    its context positions equal the unpruned video's rows of those groups; its placeholder has
    the formula's count, after the first group's separator."""
    full_model = _model(config)
    pruned_config = dataclasses.replace(config, video_pruning_rate=rate)
    pruned_model = NanoNemotronVLForConditionalGeneration(pruned_config, shared_tokenizer())
    pruned_model.load_state_dict(full_model.state_dict())
    pruned_model.eval()
    video = Video(_frames(pattern), fps=2.0)
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    k = config.num_image_token
    groups = math.ceil(len(pattern) / config.video_temporal_patch_size)

    full = NanoNemotronVLProcessor(config, shared_tokenizer())("<video>", videos=[video])
    pruned = NanoNemotronVLProcessor(pruned_config, shared_tokenizer())("<video>", videos=[video])
    expected_kept = evs.retained_count(k, groups, rate)
    assert pruned.input_ids.count(context) == expected_kept
    assert len(pruned.input_ids) == len(full.input_ids) - (groups * k - expected_kept)

    with torch.no_grad():
        full_rows = full_model.multimodal.embed_by_modality(**full.mm_kwargs)["videos"][1][0]
        pruned_rows = pruned_model.multimodal.embed_by_modality(**pruned.mm_kwargs)["videos"][1][0]
    assert pruned_rows.shape[0] == len(pruned.input_ids)  # every position of the replacement
    full_context = full_rows[torch.tensor(full.input_ids) == context].view(groups, k, -1)
    # The model's own replacement puts each group's count after its separator: the context
    # rows are where that layout, with the per-group counts known by construction, has them.
    per_group = [k if t in kept_groups else 0 for t in range(groups)]
    assert sum(per_group) == expected_kept
    layout = video_replacement_ids(
        shared_tokenizer(),
        per_group,
        list(range(len(pattern))),
        int(1000 / video.fps),
        config.video_temporal_patch_size,
    )
    assert len(layout) == pruned_rows.shape[0]
    kept = pruned_rows[torch.tensor(layout) == context]
    torch.testing.assert_close(kept, full_context[kept_groups].reshape(-1, kept.shape[-1]))


@needs_vllm
@pytest.mark.vllm
class TestParityWithVllm:
    """The reference's EVS against vLLM's ``vllm.multimodal.video_prune.evs`` on the same
    embeddings: counts exact, kept positions identical."""

    @pytest.fixture(scope="class")
    def vllm_evs(self):
        from harness.oracles.vllm_layers import init_cpu_runtime

        init_cpu_runtime()
        from vllm.multimodal.video_prune import evs as vllm_evs

        return vllm_evs

    @pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 0.75, 0.97])
    @pytest.mark.parametrize(("groups", "rows", "cols"), [(1, 2, 2), (6, 2, 2), (9, 3, 5)])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_kept_positions(self, vllm_evs, rate, groups, rows, cols, dtype):
        k = rows * cols
        generator = torch.Generator().manual_seed(groups * 100 + k)
        embeds = torch.randn(groups, k, 8, generator=generator).to(dtype)
        embeds[2::3] = embeds[1::3][: len(embeds[2::3])]  # repeated groups: exact ties at 0
        expected = vllm_evs.compute_retention_mask(
            embeds.reshape(groups * k, 8), (groups, rows, cols), spatial_merge_size=1, q=rate
        )
        assert torch.equal(evs.retention_mask(embeds, rate).flatten(), expected)
        assert int(expected.sum()) == evs.retained_count(k, groups, rate)

    @pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 0.9, 0.999])
    @pytest.mark.parametrize("k", [1, 4, 256])
    @pytest.mark.parametrize("groups", [1, 2, 7, 64])
    def test_retained_counts(self, vllm_evs, rate, k, groups):
        assert evs.retained_count(k, groups, rate) == vllm_evs.compute_retained_tokens_count(
            tokens_per_frame=k, num_frames=groups, q=rate
        )
