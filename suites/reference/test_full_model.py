"""The whole reference model: presets, end to end generation, placeholders equal embedding rows
for every modality, whole-checkpoint loading, and the connector against vLLM's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import presets
from reference_impl.checkpoint import checkpoint_state_dict, load_vl_checkpoint
from reference_impl.connector import Connector, pixel_shuffle
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer
from reference_impl.weights import WeightLoadError
from suites.harness.helpers import needs_vllm

_MODELS: dict[str, tuple[object, object]] = {}


def build(name: str, **config_changes):
    """A tiny preset's model and processor (seeded weights), cached per configuration."""
    key = name + repr(sorted(config_changes.items()))
    if key not in _MODELS:
        big = getattr(presets, name)()
        config = dataclasses.replace(presets.tiny_vl_config(big, VOCAB_SIZE), **config_changes)
        torch.manual_seed(0)
        model = NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()
        _MODELS[key] = (model, NanoNemotronVLProcessor(config, shared_tokenizer()))
    return _MODELS[key]


def pixels(h, w, seed):
    return torch.randint(
        0, 256, (h, w, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


def test_presets_have_the_published_structure():
    v2 = presets.nemotron_nano_12b_v2_vl()
    pattern = v2.text_config.hybrid_override_pattern
    assert (len(pattern), pattern.count("M"), pattern.count("*"), pattern.count("-")) == (
        62,
        28,
        6,
        28,
    )
    assert v2.num_image_token == 256
    omni = presets.nemotron_3_nano_omni()
    pattern = omni.text_config.hybrid_override_pattern
    assert (len(pattern), pattern.count("M"), pattern.count("E"), pattern.count("*")) == (
        52,
        23,
        23,
        6,
    )
    text = omni.text_config
    assert (text.n_routed_experts, text.n_shared_experts, text.num_experts_per_tok) == (128, 1, 6)
    assert omni.video_temporal_patch_size == 2
    assert omni.dynamic_resolution
    assert omni.has_audio
    assert all(
        presets.SOURCES[name] for name in ("nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni")
    )


@pytest.mark.parametrize("name", ["nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni"])
def test_tiny_presets_keep_every_kind_and_shrink_the_towers(name):
    big = getattr(presets, name)()
    tiny = presets.tiny_vl_config(big, VOCAB_SIZE)
    assert set(tiny.text_config.hybrid_override_pattern) == set(
        big.text_config.hybrid_override_pattern
    )
    assert tiny.vision_config.num_layers == 1 < big.vision_config.num_layers
    assert tiny.vision_config.hidden_size == tiny.vit_hidden_size == 32
    if big.sound_config is not None:
        assert tiny.sound_config.num_hidden_layers == 1 < big.sound_config.num_hidden_layers
        assert tiny.sound_config.llm_hidden_size == tiny.hidden_size


def omni_prompt(proc, seed=0):
    video = Video(
        torch.randint(
            0, 256, (3, 48, 48, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
        ),
        fps=2.0,
    )
    audio = torch.randn(8000, generator=torch.Generator().manual_seed(seed)) * 0.1
    return proc(
        "Look at <image> and <image>, watch <video>, hear <so_embedding>. Answer:",
        images=[pixels(40, 70, seed), pixels(64, 32, seed + 1)],
        videos=[video],
        audios=[audio],
    )


def test_end_to_end_text_images_video_audio():
    """Text + 2 images + 1 video + 1 audio -> 8 tokens, the same on every run."""
    model, proc = build("nemotron_3_nano_omni")
    prompt = omni_prompt(proc)
    assert [p.modality for p in prompt.placeholders] == ["images", "images", "videos", "audios"]
    first = model.generate(prompt, 8)
    assert len(first) == 8
    assert all(0 <= t < VOCAB_SIZE for t in first)
    assert model.generate(omni_prompt(proc), 8) == first
    torch.manual_seed(0)
    again = NanoNemotronVLForConditionalGeneration(model.config, shared_tokenizer()).eval()
    assert again.generate(prompt, 8) == first  # seeded weights: deterministic across builds


def test_generation_depends_on_the_media():
    model, proc = build("nemotron_3_nano_omni")
    logits_a = model(
        torch.tensor(omni_prompt(proc, 0).input_ids),
        torch.tensor(omni_prompt(proc, 0).is_multimodal),
        omni_prompt(proc, 0).placeholders,
        **omni_prompt(proc, 0).mm_kwargs,
    )
    other = omni_prompt(proc, 5)
    logits_b = model(
        torch.tensor(other.input_ids),
        torch.tensor(other.is_multimodal),
        other.placeholders,
        **other.mm_kwargs,
    )
    assert not torch.allclose(logits_a[-1], logits_b[-1])


@settings(max_examples=12, deadline=None)
@given(
    name=st.sampled_from(["nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni"]),
    sizes=st.lists(st.tuples(st.integers(8, 120), st.integers(8, 120)), min_size=0, max_size=2),
    max_tiles=st.integers(1, 4),
    frames=st.lists(st.integers(1, 4), min_size=0, max_size=1),
    temporal=st.sampled_from([1, 2]),
    audio=st.lists(st.integers(1, 40000), min_size=0, max_size=1),
)
def test_placeholders_equal_embedding_rows(name, sizes, max_tiles, frames, temporal, audio):
    """For any image size, tile setting, frame count, T and audio length, each item's
    placeholder count in the expanded prompt equals the rows the model produces for it."""
    model, proc = _with_temporal(name, temporal)
    if name == "nemotron_nano_12b_v2_vl":
        audio = []
    text = (
        " ".join(
            ["<image>"] * len(sizes) + ["<video>"] * len(frames) + ["<so_embedding>"] * len(audio)
        )
        or "plain"
    )
    prompt = proc(
        text,
        images=[pixels(h, w, i) for i, (h, w) in enumerate(sizes)],
        videos=[Video(torch.zeros(n, 40, 40, 3, dtype=torch.uint8)) for n in frames],
        audios=[torch.randn(n) * 0.1 for n in audio],
        max_num_tiles=max_tiles,
    )
    if not prompt.placeholders:
        return
    rows = {
        modality: [o.shape[0] for o in items]
        for modality, (_, items) in model.multimodal.embed_by_modality(**prompt.mm_kwargs).items()
    }
    for span in prompt.placeholders:
        assert rows[span.modality][span.index] == span.length, span


def _with_temporal(name, temporal):
    key = f"{name}-T{temporal}"
    if key not in _MODELS:
        big = getattr(presets, name)()
        big = dataclasses.replace(
            big,
            video_temporal_patch_size=temporal,
            vision_config=dataclasses.replace(
                big.vision_config, video_temporal_patch_size=temporal
            ),
        )
        config = presets.tiny_vl_config(big, VOCAB_SIZE)
        torch.manual_seed(0)
        _MODELS[key] = (
            NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval(),
            NanoNemotronVLProcessor(config, shared_tokenizer()),
        )
    return _MODELS[key]


def test_whole_checkpoint_round_trip():
    model, proc = build("nemotron_3_nano_omni")
    weights = checkpoint_state_dict(model)
    assert any(k.startswith("language_model.backbone.") for k in weights)
    torch.manual_seed(1)
    fresh = NanoNemotronVLForConditionalGeneration(model.config, shared_tokenizer()).eval()
    load_vl_checkpoint(fresh, weights)
    prompt = omni_prompt(proc)
    assert fresh.generate(prompt, 4) == model.generate(prompt, 4)


def test_text_only_skips_tower_weights():
    model, _ = build("nemotron_3_nano_omni")
    weights = checkpoint_state_dict(model)
    torch.manual_seed(1)
    fresh = NanoNemotronVLForConditionalGeneration(model.config, shared_tokenizer()).eval()
    before = fresh.multimodal.vision_model.blocks[0].attn.qkv.weight.clone()
    load_vl_checkpoint(fresh, weights, text_only=True)
    assert torch.equal(fresh.multimodal.vision_model.blocks[0].attn.qkv.weight, before)
    assert torch.equal(fresh.language_model.lm_head.weight, model.language_model.lm_head.weight)


def test_unknown_checkpoint_names_are_listed():
    model, _ = build("nemotron_3_nano_omni")
    weights = checkpoint_state_dict(model) | {"mystery.weight": torch.zeros(1)}
    with pytest.raises(WeightLoadError, match=r"mystery\.weight"):
        load_vl_checkpoint(model, weights)


def test_vision_final_layernorm_with_mtp_layers():
    base = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)
    assert Connector(base).vision_final_layernorm is None
    mtp = dataclasses.replace(
        base, text_config=dataclasses.replace(base.text_config, num_nextn_predict_layers=1)
    )
    assert Connector(mtp).vision_final_layernorm is not None


@needs_vllm
@pytest.mark.vllm
class TestConnectorParityWithVllm:
    def test_pixel_shuffle(self):
        """Exact (a permutation)."""
        from harness.oracles.vllm_layers import pixel_shuffle as vllm_pixel_shuffle

        x = torch.randn(2, 4, 6, 3)
        assert torch.equal(pixel_shuffle(x, 2), vllm_pixel_shuffle(x))
        with pytest.warns(UserWarning, match="transposed"):
            ours = pixel_shuffle(x, 2, "v1")
        with pytest.warns(UserWarning, match="transposed"):
            assert torch.equal(ours, vllm_pixel_shuffle(x, "v1"))

    def test_mlp1(self):
        """vLLM's RMSNorm / ReLU^2 layers: tolerance 1e-5 in fp32 (measured ~1e-7)."""
        from harness.oracles.vllm_layers import mlp1

        config = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)
        torch.manual_seed(0)
        ours = Connector(config).eval()
        with torch.no_grad():
            ours.mlp1[0].weight.normal_()
        theirs = mlp1(
            config.vit_hidden_size,
            config.projector_hidden_size,
            config.hidden_size,
            {k: v.clone() for k, v in ours.mlp1.state_dict().items()},
        )
        x = torch.randn(3, 16, 4 * config.vit_hidden_size)
        with torch.no_grad():
            assert (ours.mlp1(x) - theirs(x)).abs().max() <= 1e-5

    def test_registered_architectures(self):
        from harness.oracles.vllm_layers import init_cpu_runtime

        init_cpu_runtime()
        from vllm.model_executor.models.registry import _MULTIMODAL_MODELS

        names = {
            arch
            for arch, (module, cls) in _MULTIMODAL_MODELS.items()
            if cls == "NemotronH_Nano_VL_V2"
        }
        assert names == set(presets.ARCHITECTURES)
