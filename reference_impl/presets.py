"""Presets: the published model shapes, each size with its source (or marked assumed), and the
CPU-sized configs tests and shells build on (this module owns every small size).

- :func:`nemotron_nano_12b_v2_vl`: Nemotron Nano 12B v2 VL (``NemotronH_Nano_VL_V2``): static
  tiles, ``T = 1``, no audio.
- :func:`nemotron_3_nano_omni`: Nemotron 3 Nano Omni (``NemotronH_Nano_Omni_Reasoning_V3``):
  the Nemotron 3 Nano 30B-A3B language model, dynamic resolution, ``T = 2``, Parakeet audio.

Every architecture name vLLM 0.33.0 registers for this class maps to one of these structures.

- :func:`tiny_vl_config`: a published model shrunk to CPU size (real towers, every layer kind).
- :func:`tiny_text_config`: a CPU-sized language model of any layer pattern.
- :func:`tiny_radio_config`: a CPU-sized RADIO tower.
- :func:`bench_text_config`: the language model the speed goals are measured at.
"""

from __future__ import annotations

from reference_impl.audio import AudioConfig
from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.radio import RadioConfig
from reference_impl.shrink import minimal_vl_config

ARCHITECTURES = (
    "NemotronH_Nano_VL_V2",
    "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Super_Omni_Reasoning_V3",
    "NemotronH_Omni_Reasoning_V3",  # registered by vLLM 0.33.0 beyond the brief
)

BRIEF = "the published architecture (NVIDIA Megatron-Bridge docs for Nemotron Nano VL)"
CARD = "public model card of Nemotron 3 Nano 30B-A3B (52 layers: 23 Mamba2, 23 MoE, 6 attention)"
MILES = "miles docs (radixark.com) for Nemotron-3-Nano-30B-A3B"
ASSUMED = "assumed: not in a source this project holds; verify against the checkpoint"

PATTERN_12B = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"

#: Where each preset size comes from.
SOURCES: dict[str, dict[str, str]] = {
    "nemotron_nano_12b_v2_vl": {
        "text_config.hidden_size=5120, pattern (62 layers), heads 40 / 8, head_dim 128": BRIEF,
        "text_config.intermediate_size=20480, mamba heads 128 x 80, n_groups 8, state 128": BRIEF,
        "text_config.vocab_size=131072": ASSUMED,
        "vision vit_huge_patch16_224 (1280 wide, 32 layers), tile 512, patch 16, ratio 0.5": BRIEF,
        "projector_hidden_size=4096 (the config class default)": BRIEF + "; " + ASSUMED,
    },
    "nemotron_3_nano_omni": {
        "52 layers: 23 M, 23 E, 6 *; 128 routed + 1 shared expert, 6 per token": CARD,
        "32 attention heads, 2 KV heads": "public quantized-model card (TevunahAi GPTQ)",
        "moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5": MILES,
        "the order of the layer pattern": ASSUMED + " (6 attention layers spread evenly)",
        "hidden 2688, moe_intermediate 1856, mamba 64 x 64, head_dim 128, vocab 131072": ASSUMED,
        "dynamic resolution, T=2, video_maintain_aspect_ratio=False": "vLLM 0.33.0's test "
        "model registry (tests/models/registry.py)",
        "Parakeet: 1024 wide, 24 layers, 128 mel bins, subsampling 8": ASSUMED
        + " (transformers' ParakeetEncoderConfig defaults, 128 mel)",
    },
}


def nemotron_nano_12b_v2_vl() -> VLConfig:
    text = NemotronHConfig(
        vocab_size=131072,
        hidden_size=5120,
        hybrid_override_pattern=PATTERN_12B,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        mamba_num_heads=128,
        mamba_head_dim=80,
        n_groups=8,
        ssm_state_size=128,
        intermediate_size=20480,
        chunk_size=128,
    )
    vision = RadioConfig.from_model_name("vit_huge_patch16_224")
    return VLConfig(
        hidden_size=5120,
        vocab_size=131072,
        vit_hidden_size=1280,
        projector_hidden_size=4096,
        force_image_size=512,
        patch_size=16,
        text_config=text,
        vision_config=vision,
    )


def _omni_pattern() -> str:
    """52 layers, 23 Mamba2 / 23 MoE alternating, an attention layer after every 4 pairs."""
    layers: list[str] = []
    for pair in range(23):
        layers += ["M", "E"]
        if pair % 4 == 3 and layers.count("*") < 6:
            layers.append("*")
    while layers.count("*") < 6:
        layers.append("*")
    return "".join(layers)


def nemotron_3_nano_omni() -> VLConfig:
    text = NemotronHConfig(
        vocab_size=131072,
        hidden_size=2688,
        hybrid_override_pattern=_omni_pattern(),
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=128,
        mamba_num_heads=64,
        mamba_head_dim=64,
        n_groups=8,
        ssm_state_size=128,
        intermediate_size=1856,
        n_routed_experts=128,
        n_shared_experts=1,
        moe_intermediate_size=1856,
        moe_shared_expert_intermediate_size=3712,
        num_experts_per_tok=6,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        chunk_size=128,
    )
    vision = RadioConfig.from_model_name("vit_huge_patch16_224", video_temporal_patch_size=2)
    sound = AudioConfig(llm_hidden_size=2688, num_mel_bins=128)
    return VLConfig(
        hidden_size=2688,
        vocab_size=131072,
        vit_hidden_size=1280,
        projector_hidden_size=4096,
        force_image_size=512,
        patch_size=16,
        video_temporal_patch_size=2,
        dynamic_resolution=True,
        min_num_patches=1,
        max_num_patches=12 * 1024,
        text_config=text,
        vision_config=vision,
        sound_config=sound,
    )


def tiny_vl_config(config: VLConfig, vocab_size: int) -> VLConfig:
    """A CPU-sized variant with every layer kind, real towers, and the test tokenizer's
    vocabulary: 32 px tiles of 8 px patches (4 embedding rows per tile)."""
    text = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 16,
        "chunk_size": 16,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 48,
    }
    vision = {
        "hidden_size": 32,
        "num_heads": 4,
        "mlp_size": 64,
        "patch_size": 8,
        "image_size": 32,
        "cpe_max_size": 128,
    }
    sound = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "subsampling_conv_channels": 8,
        "projection_hidden_size": 48,
        "num_mel_bins": 16,
        "conv_kernel_size": 5,
    }
    overrides: dict[str, object] = {
        "text_config": text,
        "vision_config": vision,
        "projector_hidden_size": 48,
        "force_image_size": 32,
        "max_num_tiles": 4,
        "max_model_len": 2048,
    }
    if config.sound_config is not None:
        overrides["sound_config"] = sound
    if config.dynamic_resolution:
        overrides["max_num_patches"] = 64
    return minimal_vl_config(config, overrides=overrides)


def tiny_text_config(pattern: str = "M*-E", **fields: object) -> NemotronHConfig:
    """A CPU-sized language model with the layers of ``pattern`` (every kind by default):
    32 wide, 4 attention heads over 2 KV heads, 4 Mamba heads in 2 groups, 8 routed experts."""
    sizes: dict[str, object] = {
        "vocab_size": 97,
        "hidden_size": 32,
        "hybrid_override_pattern": pattern,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "n_groups": 2,
        "ssm_state_size": 8,
        "chunk_size": 8,
        "intermediate_size": 48,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "moe_shared_expert_intermediate_size": 24,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 1.5,
    }
    return NemotronHConfig(**{**sizes, **fields})  # type: ignore[arg-type]


def tiny_radio_config(**fields: object) -> RadioConfig:
    """A CPU-sized RADIO tower: 2 layers 32 wide, 8 px patches, 32 px images."""
    sizes: dict[str, object] = {
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "mlp_size": 64,
        "patch_size": 8,
        "image_size": 32,
        "cpe_max_size": 128,
    }
    return RadioConfig.from_model_name("vit_small_patch16_224", **{**sizes, **fields})


def bench_text_config(pattern: str) -> NemotronHConfig:
    """The language model the speed goals are measured at (``nox -s bench``): 256 wide, the
    size the transformers figures they compare against were taken at."""
    return NemotronHConfig(
        vocab_size=1024,
        hidden_size=256,
        hybrid_override_pattern=pattern,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        mamba_num_heads=8,
        mamba_head_dim=64,
        n_groups=2,
        ssm_state_size=64,
        chunk_size=128,
        intermediate_size=1024,
    )
