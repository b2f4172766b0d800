"""What a checkpoint variant is: :class:`ModelSpec` and the reference config it is written from.

:class:`ModelSpec` names a variant: the language model's shape (V2: Mamba, MLP and attention
layers; Omni: Mamba, MoE and attention layers), static tiles or dynamic resolution, with or
without audio, the video temporal patch ``T``, MTP layers, an ``fp8`` checkpoint, the dtype the
weights are saved in. The vision tower is RADIO ``vit_small_patch16_224`` (384 wide, 12 layers):
vLLM sizes RADIO from its model-name table with no depth override on this path, and this is the
smallest entry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from harness import ROOT
from reference_impl import presets
from reference_impl.audio import AudioConfig
from reference_impl.config import VLConfig
from reference_impl.radio import RADIO_SIZES
from reference_impl.shrink import minimal_vl_config
from reference_impl.tokenizer import VOCAB_SIZE

CONFIG_MODULE = ROOT / "fixtures" / "checkpoint" / "configuration_nano_nemotron_vl.py"
RADIO_MODEL = "vit_small_patch16_224"
AUTO_CONFIG = f"{CONFIG_MODULE.stem}.NanoNemotronVLConfig"


#: Static tiles per image when the engine is not told otherwise (vLLM's and the reference's).
DEFAULT_MAX_NUM_TILES = 12
#: The name of a dtype a checkpoint folder can be saved in.
CheckpointDtype = Literal["bfloat16", "float32"]
#: The dtypes a checkpoint folder can be saved in (``ModelSpec.checkpoint_dtype``).
CHECKPOINT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: The pixel normalisations a checkpoint's ``norm_mean`` / ``norm_std`` can name: CLIP's (both
#: published checkpoints) and SigLIP's 0.5 per channel.
PIXEL_NORMALISATIONS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
#: The sizes a variant's language model and audio tower take: ``"default"`` (the tiny shapes
#: every variant shares) or ``"other"``, where every size, bias switch and norm epsilon the
#: tower's vLLM code reads takes another valid value, so that code that read a constant instead
#: builds the wrong shapes (the folder's weights do not load) or computes other rows (the
#: config-field inventory found these fields read with no variant setting them).
Sizes = Literal["default", "other"]
SIZES: tuple[Sizes, ...] = ("default", "other")
#: NemotronH's ``text_config`` under ``text_sizes="other"`` (the attention, Mamba, MLP and MoE
#: sizes, and the bias switches; the hidden size is its own field, ``hidden_size``).
OTHER_TEXT_SIZES: dict[str, int | bool] = {
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 24,
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "n_groups": 4,
    "ssm_state_size": 8,
    "conv_kernel": 3,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 40,
    # Two shared experts in one MLP twice as wide, and routed experts in a 24-wide latent space
    # (both published checkpoints: one, and none; read only by MoE layers, built on CUDA).
    "n_shared_experts": 2,
    "moe_latent_size": 24,
    "use_bias": True,
    "use_conv_bias": False,
    "mlp_bias": True,
    # An embedding table longer than the tokenizer's 266 tokens (rows no token reaches).
    "vocab_size": 300,
}
#: Parakeet's ``sound_config`` under ``sound_sizes="other"``.
OTHER_SOUND_SIZES: dict[str, int | float | bool | str] = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 80,
    "subsampling_conv_channels": 4,
    "subsampling_conv_kernel_size": 5,
    # Two strided convolutions, not three (the factor's log2), each of stride 4, not 2: a
    # sixteenth of the frames, not an eighth (read by the processor's token count and by the
    # encoder). transformers' encoder sizes its linear layer as mel bins // stride ** 2, which
    # matches what its convolutions leave for 16 and 32 bins at stride 4, not at stride 3.
    "subsampling_factor": 4,
    "subsampling_conv_stride": 4,
    # The feed-forward's and the convolution module's activation (both checkpoints: silu).
    "hidden_act": "gelu",
    "projection_hidden_size": 40,
    # The projection's RMS norm epsilon, large enough to move the rows past their bound.
    "projection_eps": 0.5,
    "conv_kernel_size": 3,
    "projection_bias": True,
}
_CHANGED_FIELD_SLUGS = (
    ("max_num_tiles", "tiles"),
    ("video_pruning_rate", "evs"),
    ("hidden_size", "d"),
    ("image_size", "px"),
    ("projector_hidden_size", "proj"),
    ("num_mel_bins", "mel"),
    ("downsample_ratio", "shuffle"),
    ("ps_version", "ps"),
    ("audio_sampling_rate", "sr"),
    ("vision_final_layernorm_eps", "vision-eps"),
    ("video_target_num_patches", "video-patches"),
)


#: The fields of :class:`ModelSpec` that take one of a few values, and those values.
_CHOICES: dict[str, tuple[object, ...]] = {
    "language_model": ("v2", "omni"),
    "video_temporal_patch_size": (1, 2),
    "quantization": ("none", "fp8"),
    "checkpoint_dtype": tuple(sorted(CHECKPOINT_DTYPES)),
    "pixel_normalisation": tuple(sorted(PIXEL_NORMALISATIONS)),
    "text_sizes": SIZES,
    "sound_sizes": SIZES,
    "ps_version": ("v2", "v1"),
    "audio_sampling_rate": (16000, 8000),
    "downsample_ratio": (0.5, 0.25),
    "vision_final_layernorm_eps": (1e-6, 1000.0),
}


@dataclass(frozen=True)
class ModelSpec:
    """A variant of the tiny checkpoint, and the sizes the suites read from it.

    The default is the V2-shaped language model (every kind vLLM builds on a CPU) with static
    64 px tiles, ``T = 1`` and audio.
    """

    language_model: Literal["v2", "omni"] = "v2"
    dynamic_resolution: bool = False
    audio: bool = True
    video_temporal_patch_size: int = 1
    mtp: bool = False
    audio_hop_length: int = 160  # the feature extractor's hop (Parakeet's default: 160)
    max_model_len: int = 4096  # the engine's context (the dynamic tiler's budget)
    audio_convolution_bias: bool = True  # False: the Omni form (biases still in the file)
    quantization: Literal["none", "fp8"] = "none"  # "fp8": see writer.fp8_checkpoint
    # The dtype the folder's weights are saved in (its config's ``torch_dtype``): vLLM's
    # ``--dtype auto`` serves a bf16 folder in bf16, an fp32 one in its platform's half precision.
    checkpoint_dtype: CheckpointDtype = "bfloat16"
    # A serving option, not a checkpoint field: the engine-level limit of static tiles per
    # image (vLLM's processor option `max_num_tiles`, default 12), see `processor_options`.
    max_num_tiles: int = DEFAULT_MAX_NUM_TILES
    # A serving option too: EVS, the fraction of each video's tokens the model drops (vLLM's
    # `--video-pruning-rate`). Left unchecked here on purpose: the target must refuse a rate
    # outside [0, 1) itself, and the checks send some.
    video_pruning_rate: float = 0.0

    # Static tiling adds a thumbnail of the whole image when it cuts more than one tile.
    use_thumbnail: bool = True
    # The pixel normalisation (``norm_mean`` / ``norm_std``), a name of PIXEL_NORMALISATIONS.
    pixel_normalisation: Literal["clip", "half"] = "clip"
    # RADIO's timm arguments (``vision_config.args``): registers padding the class tokens to a
    # multiple of this (None: none, as in both published checkpoints), and the side in pixels
    # of the position-embedding table the patches' embeddings are cropped or interpolated from.
    register_multiple: int | None = 8
    cpe_max_size: int = 256
    # The language model's and the audio tower's sizes (SIZES): the shared tiny ones, or every
    # size their vLLM code reads changed (OTHER_TEXT_SIZES, OTHER_SOUND_SIZES).
    text_sizes: Sizes = "default"
    sound_sizes: Sizes = "default"

    # Sizes shared by every variant.
    hidden_size: int = 64
    image_size: int = 64  # a static tile's side: a 4 x 4 patch grid, 4 embedding rows
    projector_hidden_size: int = 64
    num_mel_bins: int = 16
    # The pixel shuffle's ratio (both published checkpoints: 0.5, 2 x 2 patches per token);
    # 0.25 merges 4 x 4 patches into one token, and ``mlp1`` takes 16 patches' channels.
    downsample_ratio: float = 0.5
    # The pixel shuffle's version: "v1" (legacy) leaves each tile's token grid transposed.
    ps_version: Literal["v2", "v1"] = "v2"
    # The rate Parakeet's features are computed at (sound_config.sampling_rate; Omni: 16 kHz):
    # the target resamples every clip to it, and the mel filters span half of it.
    audio_sampling_rate: int = 16000
    # vision_config.layer_norm_eps: the epsilon of the LayerNorm MTP checkpoints put on the
    # vision features (both published checkpoints: 1e-6).
    vision_final_layernorm_eps: float = 1e-6
    # vision_config.video_target_num_patches: frames resized to about this many patches instead
    # of a tile's side (None: the tile, as in both published checkpoints), keeping each video's
    # aspect ratio when ``video_maintain_aspect_ratio`` is set.
    video_target_num_patches: int | None = None
    video_maintain_aspect_ratio: bool = False

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"ModelSpec.{name}: expected one of {list(allowed)}, got "
                    f"{getattr(self, name)!r}"
                )
        if not 1 <= self.max_num_tiles <= DEFAULT_MAX_NUM_TILES:
            raise ValueError(
                f"ModelSpec.max_num_tiles: expected 1..{DEFAULT_MAX_NUM_TILES}, got "
                f"{self.max_num_tiles!r}"
            )
        if self.video_target_num_patches is not None and not (
            isinstance(self.video_target_num_patches, int) and self.video_target_num_patches >= 1
        ):
            raise ValueError(
                "ModelSpec.video_target_num_patches: expected None or a positive int, got "
                f"{self.video_target_num_patches!r}"
            )
        if self.video_maintain_aspect_ratio and self.video_target_num_patches is None:
            raise ValueError(
                "ModelSpec.video_maintain_aspect_ratio: expected False without "
                "video_target_num_patches (frames keep their aspect only when resized to a patch "
                "target), got True"
            )
        if self.quantization == "fp8" and self.language_model != "v2":
            raise ValueError(
                "ModelSpec.quantization: 'fp8' is written for the 'v2' language model only (no "
                f"MoE experts), got language_model={self.language_model!r}"
            )

    @property
    def patch_size(self) -> int:
        return 16

    @property
    def tokens_per_tile(self) -> int:
        return self.vl_config().num_image_token

    @property
    def slug(self) -> str:
        parts = [
            self.language_model,
            "dynamic" if self.dynamic_resolution else "static",
            "audio" if self.audio else "no-audio",
            f"t{self.video_temporal_patch_size}",
        ]
        if self.mtp:
            parts.append("mtp")
        if self.audio_hop_length != 160:
            parts.append(f"hop{self.audio_hop_length}")
        if self.max_model_len != 4096:
            parts.append(f"len{self.max_model_len}")
        if not self.audio_convolution_bias:
            parts.append("no-conv-bias")
        if self.quantization != "none":
            parts.append(self.quantization)
        if self.checkpoint_dtype != "bfloat16":
            parts.append(f"saved-{self.checkpoint_dtype}")
        if not self.use_thumbnail:
            parts.append("no-thumbnail")
        if self.pixel_normalisation != "clip":
            parts.append(f"norm-{self.pixel_normalisation}")
        if self.register_multiple != 8:
            parts.append(f"registers-{self.register_multiple}")
        if self.cpe_max_size != 256:
            parts.append(f"cpe{self.cpe_max_size}")
        if self.text_sizes != "default":
            parts.append(f"lm-{self.text_sizes}-sizes")
        if self.sound_sizes != "default":
            parts.append(f"sound-{self.sound_sizes}-sizes")
        if self.video_maintain_aspect_ratio:
            parts.append("video-aspect")
        # The other fields too, when changed: the slug names the folder, one per spec.
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, short in _CHANGED_FIELD_SLUGS:
            if getattr(self, name) != defaults[name]:
                parts.append(f"{short}{getattr(self, name)}")
        return "-".join(parts)

    @property
    def processor_options(self) -> dict[str, int]:
        """The options the serving engine's processor starts with (vLLM's engine-level
        ``mm_processor_kwargs``); none for the defaults."""
        if self.max_num_tiles == DEFAULT_MAX_NUM_TILES:
            return {}
        return {"max_num_tiles": self.max_num_tiles}

    @property
    def checkpoint(self) -> ModelSpec:
        """The spec of the checkpoint folder this variant serves: its serving options that no
        file holds (the pruning rate) back at their defaults, so the variants share a folder."""
        return dataclasses.replace(self, video_pruning_rate=0.0)

    def vl_config(self) -> VLConfig:
        """The reference config this checkpoint is written from."""
        return _vl_config(self)


_CONFIGS: dict[ModelSpec, VLConfig] = {}


def _vl_config(spec: ModelSpec) -> VLConfig:
    if spec in _CONFIGS:
        return _CONFIGS[spec]
    base = (
        presets.nemotron_3_nano_omni()
        if spec.language_model == "omni"
        else presets.nemotron_nano_12b_v2_vl()
    )
    hidden, layers, heads, mlp = RADIO_SIZES[RADIO_MODEL]
    text = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": spec.hidden_size // 4,
        "mamba_num_heads": 4,
        "mamba_head_dim": spec.hidden_size // 4,
        "n_groups": 2,
        "ssm_state_size": 16,
        "chunk_size": 16,
        "intermediate_size": 2 * spec.hidden_size,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 48,
        "num_nextn_predict_layers": 1 if spec.mtp else 0,
    }
    if spec.text_sizes == "other":
        text.update(OTHER_TEXT_SIZES)
    vision = {
        "model_name": RADIO_MODEL,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "mlp_size": mlp,
        "patch_size": spec.patch_size,
        "image_size": spec.image_size,
        "cpe_max_size": spec.cpe_max_size,
        "register_multiple": spec.register_multiple,
        "video_temporal_patch_size": spec.video_temporal_patch_size,
        "final_layernorm_eps": spec.vision_final_layernorm_eps,
    }
    sound: dict[str, int | float | bool | str] = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "subsampling_conv_channels": 8,
        "projection_hidden_size": 48,
        "num_mel_bins": spec.num_mel_bins,
        "conv_kernel_size": 5,
        "hop_length": spec.audio_hop_length,
        "sampling_rate": spec.audio_sampling_rate,
        "convolution_bias": spec.audio_convolution_bias,
    }
    if spec.sound_sizes == "other":
        sound.update(OTHER_SOUND_SIZES)
    overrides: dict[str, object] = {
        "text_config": text,
        "vision_config": vision,
        "projector_hidden_size": spec.projector_hidden_size,
        "downsample_ratio": spec.downsample_ratio,
        "ps_version": spec.ps_version,
        "force_image_size": spec.image_size,
        "max_model_len": spec.max_model_len,
        "dynamic_resolution": spec.dynamic_resolution,
        "min_num_patches": 1,
        "max_num_patches": 64 if spec.dynamic_resolution else 0,
        "max_num_tiles": spec.max_num_tiles,
        "use_thumbnail": spec.use_thumbnail,
        "norm_mean": PIXEL_NORMALISATIONS[spec.pixel_normalisation][0],
        "norm_std": PIXEL_NORMALISATIONS[spec.pixel_normalisation][1],
        "video_target_num_patches": spec.video_target_num_patches,
        "video_maintain_aspect_ratio": spec.video_maintain_aspect_ratio,
    }
    if spec.audio:
        overrides["sound_config"] = sound
    if spec.audio and base.sound_config is None:  # a V2-shaped LM with an audio tower
        base = dataclasses.replace(base, sound_config=AudioConfig(llm_hidden_size=base.hidden_size))
    elif not spec.audio:
        base = dataclasses.replace(base, sound_config=None, has_audio=False)
    config = minimal_vl_config(base, overrides=overrides)
    _CONFIGS[spec] = config
    return config
