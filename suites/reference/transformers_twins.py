"""Shared pieces of the transformers oracle tests (``test_oracles_vision.py``,
``test_oracles_tiling.py``, ``test_oracles_audio.py``): the reference's vision, processor and audio
paths checked against transformers' own implementations (transformers 5.20), not vLLM's.

A transformers twin of a reference model is built from the reference's config and loaded with the
reference's weights (perturbed first so that every norm and bias matters); tolerances are fp32
rounding (measured on CPU, noted per test).

Not a test module. Importing it skips the importing test module (``pytest.importorskip``) where
transformers has no port of the Omni checkpoint or torchvision is absent: import it before any
other transformers module the tests read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from reference_impl import presets
from reference_impl.config import VLConfig
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.radio import RadioConfig
from reference_impl.tokenizer import (
    AUDIO_CONTEXT,
    IMG_CONTEXT,
    VOCAB_SIZE,
    shared_tokenizer,
)

omni_modeling = pytest.importorskip(
    "transformers.models.nemotron_h_omni.modeling_nemotron_h_omni",
    reason="transformers before 5.20 has no port of the Omni checkpoint",
)
pytest.importorskip("torchvision", reason="transformers' image processors resize with torchvision")
from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3_Config,
)
from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3Processor,
)
from transformers.models.radio.configuration_radio import (  # noqa: E402
    RadioConfig as HFRadioConfig,
)

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
#: The tiny Omni preset, with frames resized towards a patch target keeping their aspect (the
#: checkpoint's video processor has no S x S mode).
OMNI = dataclasses.replace(
    presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE),
    video_target_num_patches=24,
    video_maintain_aspect_ratio=True,
)
STATIC = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)


def pixels(h: int, w: int, seed: int) -> torch.Tensor:
    """An ``[h, w, 3]`` uint8 image of noise."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8)


# ---------------------------------------------------------------------------------------------
# Twins: transformers' modules with the reference's weights


def hf_radio_config(config: RadioConfig, num_registers: int, temporal: int | None) -> Any:
    """transformers' RADIO config for the reference's tower shape, with the register count
    given by the caller (so a test can state it by hand)."""
    hf = HFRadioConfig(
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        mlp_ratio=config.mlp_size / config.hidden_size,
        patch_size=config.patch_size,
        image_size=config.image_size,
        max_img_size=config.cpe_max_size,
        num_cls_tokens=config.num_cls_tokens,
        num_registers=num_registers,
        video_temporal_patch_size=temporal,
        summary_idxs=[0],
        layer_norm_eps=config.layer_norm_eps,
    )
    hf._attn_implementation = "eager"
    return hf


def radio_weights(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The reference RADIO's weights under transformers' names: the fused ``qkv`` split in
    three (query, key, value: the checkpoint's order), ``proj`` as ``o_proj``."""
    out = {
        f"{prefix}embeddings.patch_projection.weight": state["patch_generator.embedder.weight"],
        f"{prefix}embeddings.position_embedding": state["patch_generator.pos_embed"],
        f"{prefix}embeddings.cls_register_token": state["patch_generator.cls_token"],
    }
    if "patch_generator.video_embedder.weight" in state:
        out[f"{prefix}embeddings.video_patch_projection.weight"] = state[
            "patch_generator.video_embedder.weight"
        ]
    layer = 0
    while f"blocks.{layer}.norm1.weight" in state:
        ours, theirs = f"blocks.{layer}.", f"{prefix}encoder.layer.{layer}."
        for a, b in (
            ("norm1", "norm1"),
            ("norm2", "norm2"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
            ("attn.proj", "attention.o_proj"),
        ):
            out[f"{theirs}{b}.weight"] = state[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.bias"] = state[f"{ours}{a}.bias"]
        weights = state[f"{ours}attn.qkv.weight"].chunk(3)
        biases = state[f"{ours}attn.qkv.bias"].chunk(3)
        for name, weight, bias in zip("qkv", weights, biases, strict=True):
            out[f"{theirs}attention.{name}_proj.weight"] = weight
            out[f"{theirs}attention.{name}_proj.bias"] = bias
        layer += 1
    return out


def projector_weights(sequential: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """``RMSNorm, Linear, ReLU^2, Linear`` (indices 0, 1, 3) under transformers' projector
    names."""
    names = {"0": "layer_norm", "1": "linear_1", "3": "linear_2"}
    return {
        f"{prefix}{names[key.split('.')[0]]}.{key.split('.', 1)[1]}": tensor
        for key, tensor in sequential.state_dict().items()
    }


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Every parameter moved by N(0, 0.1²): norm weights away from 1, biases away from 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def load(hf: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load ``weights`` into ``hf``; transformers' own layer scales (ones), ``summary_idxs``, the
    language model and a video projection the reference lacks (T = 1; all unused here) are all
    it may keep."""
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    unused = ("layer_scale", "summary_idxs", "video_patch_projection")
    kept = [
        m
        for m in missing
        if not m.startswith("language_model.") and not any(u in m for u in unused)
    ]
    assert not kept, f"transformers' twin kept its own random {kept}"


@dataclasses.dataclass
class Twins:
    """A reference model and transformers' Omni model carrying its weights."""

    ours: NanoNemotronVLForConditionalGeneration
    theirs: Any  # transformers' NemotronH_Omni_Reasoning_V3


def twins(config: VLConfig, seed: int = 0) -> Twins:
    """The reference model for ``config`` and transformers' Omni model built from the same
    sizes, carrying the reference's (perturbed) vision, connector and audio weights."""
    tokenizer = shared_tokenizer()
    torch.manual_seed(seed)
    ours = NanoNemotronVLForConditionalGeneration(config, tokenizer).eval()
    mm: Any = ours.multimodal
    perturb(mm.vision_model, seed + 1)
    perturb(mm.connector, seed + 2)
    if mm.sound_encoder is not None:
        perturb(mm.sound_encoder.projection, seed + 3)
    vision = config.vision_config
    text = config.text_config
    assert vision is not None
    assert text is not None
    text_fields = text.to_transformers_dict()
    if text.num_nextn_predict_layers:
        text_fields["mtp_layers_block_type"] = ["attention"] * text.num_nextn_predict_layers
    vision_fields = hf_radio_config(vision, vision.num_registers, 2)
    # transformers' port reads one epsilon for RADIO's blocks and the MTP vision norm.
    assert vision.layer_norm_eps == vision.final_layernorm_eps
    sound = config.sound_config
    hf_config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=vision_fields,
        text_config=text_fields,
        # Without attention_bias / scale_input: the port supplies the checkpoint's values.
        audio_config=None
        if sound is None
        else {
            **sound.encoder_fields(),
            "projection_hidden_size": sound.projection_hidden_size,
            "projection_bias": sound.projection_bias,
        },
        downsample_ratio=config.downsample_ratio,
        projector_hidden_size=config.projector_hidden_size,
        vision_hidden_size=config.vit_hidden_size,
        video_temporal_patch_size=2,
        image_token_id=tokenizer.convert_tokens_to_ids(IMG_CONTEXT),
        audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO_CONTEXT),
    )
    hf_config._attn_implementation = "eager"
    hf_config.vision_config._attn_implementation = "eager"
    theirs = omni_modeling.NemotronH_Omni_Reasoning_V3(hf_config).eval()
    weights = radio_weights(mm.vision_model.state_dict(), "vision_model.")
    weights |= projector_weights(mm.connector.mlp1, "multi_modal_projector.")
    if mm.connector.vision_final_layernorm is not None:
        for key, tensor in mm.connector.vision_final_layernorm.state_dict().items():
            weights[f"vision_final_layernorm.{key}"] = tensor
    if mm.sound_encoder is not None:
        encoder = mm.sound_encoder.encoder.state_dict()
        weights |= {f"audio_tower.{k}": t for k, t in encoder.items()}
        weights |= projector_weights(mm.sound_encoder.projection, "embed_audio.")
    load(theirs, weights)
    return Twins(ours, theirs)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest elementwise difference of two equally shaped lists of tensors."""
    assert [tuple(x.shape) for x in a] == [tuple(y.shape) for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def omni_processor(image_processor: Any = None) -> Any:
    """transformers' Omni processor holding only what its placeholder text methods read (the
    whole processor needs the checkpoint's tokenizer and feature extractor)."""
    processor = object.__new__(NemotronH_Omni_Reasoning_V3Processor)
    processor.image_start_token, processor.image_end_token = "<img>", "</img>"
    processor.image_token = IMG_CONTEXT
    processor.image_processor = image_processor
    processor.video_temporal_patch_dim = 2
    processor.audio_hop_length = 160
    processor.audio_subsampling_factor = 8
    return processor
