"""Configuration: the language model's (:class:`NemotronHConfig`) and the multimodal
wrapper's (:class:`VLConfig`).

One dataclass flows top-down into every constructor. Field names follow the checkpoint's
configs (``hybrid_override_pattern``, ``force_image_size``, ...); derived sizes are computed in
``__post_init__`` so no module recomputes them; every invalid value raises :class:`ConfigError`
naming the field.

RADIO (``vision_config``) and Parakeet (``sound_config``) configs arrive with the towers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from reference_impl.errors import ConfigError
from reference_impl.evs import check_rate

if TYPE_CHECKING:  # types only: the towers (and torch) load when a model is built
    from reference_impl.audio import AudioConfig
    from reference_impl.radio import RadioConfig

#: Pattern letters and the layer kind each one builds: the one table every letter is read from.
LAYER_KINDS: dict[str, str] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: Layer kinds that transformers 5 names differently in ``layers_block_type``.
_TRANSFORMERS_KIND_NAMES: dict[str, str] = {
    "mamba": "linear_attention",
    "attention": "full_attention",
}
#: Pattern letters to the ``layers_block_type`` names transformers 5 writes (and validates).
TRANSFORMERS_BLOCK_TYPES: dict[str, str] = {
    letter: _TRANSFORMERS_KIND_NAMES.get(kind, kind) for letter, kind in LAYER_KINDS.items()
}
#: ``layers_block_type`` names (transformers 5 and older checkpoints) to pattern letters.
BLOCK_TYPE_LETTERS: dict[str, str] = {
    **{kind: letter for letter, kind in LAYER_KINDS.items()},
    **{name: letter for letter, name in TRANSFORMERS_BLOCK_TYPES.items()},
}
#: Constructor (checkpoint) argument names that differ from the attribute names.
NEMOTRON_H_ALIASES: dict[str, str] = {
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_chunk_size": "chunk_size",
    "mamba_d_state": "ssm_state_size",
}


def merge_block_types(values: dict[str, Any], blocks: Any, where: str = "") -> None:
    """Set ``values["hybrid_override_pattern"]`` from a ``layers_block_type`` list (transformers
    5's form of the pattern), or check that the pattern already there agrees; ``where`` prefixes
    the field names in errors."""
    if blocks is None:
        return
    try:
        from_blocks = "".join(BLOCK_TYPE_LETTERS[b] for b in blocks)
    except (KeyError, TypeError):
        raise ConfigError(
            f"{where}layers_block_type", f"a list of {sorted(BLOCK_TYPE_LETTERS)}", blocks
        ) from None
    given = values.setdefault("hybrid_override_pattern", from_blocks)
    if given != from_blocks:
        raise ConfigError(
            f"{where}hybrid_override_pattern", f"{from_blocks!r} as layers_block_type says", given
        )


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(name, "a positive int", value)


@dataclass(frozen=True)
class NemotronHConfig:
    """The hybrid language model (``text_config``; ``model_type="nemotron_h"``).

    ``hybrid_override_pattern`` has one letter per layer: ``M`` Mamba2, ``*`` attention, ``-``
    MLP, ``E`` MoE. Mamba: ``I = mamba_num_heads * mamba_head_dim`` channels in ``n_groups``
    groups sharing B and C, state size ``N = ssm_state_size``. MoE: ``n_routed_experts`` in
    ``n_group`` groups, ``topk_group`` groups and ``num_experts_per_tok`` experts chosen per
    token. ``time_step_*`` are carried for round trips; like vLLM, the forward pass uses
    ``dt = softplus(dt + dt_bias)`` with no clamp.
    """

    vocab_size: int
    hidden_size: int
    hybrid_override_pattern: str
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    attention_bias: bool = False
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    n_groups: int = 8
    ssm_state_size: int = 128
    conv_kernel: int = 4
    use_conv_bias: bool = True
    use_bias: bool = False
    chunk_size: int = 256
    intermediate_size: int | tuple[int, ...] = 4 * 1024
    mlp_bias: bool = False
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    moe_intermediate_size: int = 1024
    moe_shared_expert_intermediate_size: int = 1024
    moe_latent_size: int | None = None
    num_experts_per_tok: int = 2
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0  # MTP layers (skipped); > 0 adds vision_final_layernorm
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_floor: float = 1e-4
    model_type: ClassVar[str] = "nemotron_h"

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "mamba_num_heads",
            "mamba_head_dim",
            "n_groups",
            "ssm_state_size",
            "conv_kernel",
            "chunk_size",
        ):
            _positive_int(name, getattr(self, name))
        pattern = self.hybrid_override_pattern
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError("hybrid_override_pattern", "a non-empty string", pattern)
        unknown = sorted(set(pattern) - set(LAYER_KINDS))
        if unknown:
            raise ConfigError(
                "hybrid_override_pattern",
                f"letters from {''.join(LAYER_KINDS)}",
                f"{pattern!r} (unknown {''.join(unknown)!r})",
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                "num_key_value_heads",
                f"a divisor of num_attention_heads={self.num_attention_heads}",
                self.num_key_value_heads,
            )
        if self.mamba_num_heads % self.n_groups:
            raise ConfigError(
                "n_groups", f"a divisor of mamba_num_heads={self.mamba_num_heads}", self.n_groups
            )
        if self.head_dim is not None:
            _positive_int("head_dim", self.head_dim)
        elif "attention" in self.layer_kinds and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "head_dim",
                f"set, as hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}",
                None,
            )
        raw = cast(object, self.intermediate_size)
        if isinstance(raw, list):  # from JSON: store as a tuple
            object.__setattr__(self, "intermediate_size", tuple(raw))
        widths = self.intermediate_size
        if isinstance(widths, tuple):
            mlp_layers = self.layer_kinds.count("mlp")
            if len(widths) != mlp_layers:
                raise ConfigError(
                    "intermediate_size",
                    f"one width per MLP layer ({mlp_layers} in the pattern)",
                    f"{len(widths)} widths",
                )
            for i, width in enumerate(widths):
                _positive_int(f"intermediate_size[{i}]", width)
        else:
            _positive_int("intermediate_size", widths)
        if "moe" in self.layer_kinds:
            self._validate_moe()

    def _validate_moe(self) -> None:
        for name in (
            "n_routed_experts",
            "moe_intermediate_size",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
        ):
            _positive_int(name, getattr(self, name))
        if self.n_routed_experts % self.n_group:
            raise ConfigError(
                "n_group", f"a divisor of n_routed_experts={self.n_routed_experts}", self.n_group
            )
        if self.topk_group > self.n_group:
            raise ConfigError("topk_group", f"at most n_group={self.n_group}", self.topk_group)
        selectable = self.topk_group * (self.n_routed_experts // self.n_group)
        if self.num_experts_per_tok > selectable:
            raise ConfigError(
                "num_experts_per_tok",
                f"at most the {selectable} experts in topk_group={self.topk_group} groups",
                self.num_experts_per_tok,
            )
        if self.n_shared_experts < 0:
            raise ConfigError("n_shared_experts", "a non-negative int", self.n_shared_experts)
        if self.n_shared_experts:
            _positive_int(
                "moe_shared_expert_intermediate_size", self.moe_shared_expert_intermediate_size
            )
        if self.moe_latent_size is not None:
            _positive_int("moe_latent_size", self.moe_latent_size)

    # Derived sizes -------------------------------------------------------------------------

    @property
    def num_hidden_layers(self) -> int:
        return len(self.hybrid_override_pattern)

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def mamba_intermediate_size(self) -> int:
        """``I = mamba_num_heads * mamba_head_dim``."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the causal conv: ``x``, ``B`` and ``C``: ``I + 2 * G * N``."""
        return self.mamba_intermediate_size + 2 * self.n_groups * self.ssm_state_size

    def mlp_width(self, layer: int) -> int:
        """Width of the MLP at ``layer`` (a list is indexed by the MLP's ordinal)."""
        if isinstance(self.intermediate_size, int):
            return self.intermediate_size
        return self.intermediate_size[self.layer_kinds[: layer + 1].count("mlp") - 1]

    @property
    def layer_kinds(self) -> list[str]:
        return [LAYER_KINDS[c] for c in self.hybrid_override_pattern]

    # HF dict round trip --------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, data: Mapping[str, Any]) -> NemotronHConfig:
        """Read a checkpoint ``config.json`` (``hybrid_override_pattern``, ``mamba_n_groups``,
        ...) or a transformers 5 one (``layers_block_type``). Unknown keys are ignored (HF configs
        carry many); conflicting ones raise."""
        values: dict[str, Any] = {}
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            name = NEMOTRON_H_ALIASES.get(key, key)
            if name not in names:
                continue
            if name in values and values[name] != value:
                raise ConfigError(name, f"one value (also given as {key!r})", value)
            values[name] = value
        merge_block_types(values, data.get("layers_block_type"))
        if "hybrid_override_pattern" not in values:
            raise ConfigError(
                "hybrid_override_pattern", "present (or layers_block_type)", "neither"
            )
        layers = data.get("num_hidden_layers")
        if layers is not None and layers != len(values["hybrid_override_pattern"]):
            raise ConfigError(
                "num_hidden_layers",
                f"the pattern's length {len(values['hybrid_override_pattern'])} "
                f"({values['hybrid_override_pattern']!r})",
                layers,
            )
        if isinstance(values.get("intermediate_size"), list):
            values["intermediate_size"] = tuple(values["intermediate_size"])
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        """The checkpoint form: ``hybrid_override_pattern`` and ``num_hidden_layers``."""
        data: dict[str, Any] = {"model_type": self.model_type}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = list(value) if isinstance(value, tuple) else value
        data["num_hidden_layers"] = self.num_hidden_layers
        return data

    def to_transformers_dict(self) -> dict[str, Any]:
        """The transformers 5 form (``layers_block_type``) for its ``NemotronHConfig``."""
        data = self.to_hf_dict()
        pattern = data.pop("hybrid_override_pattern")
        data["layers_block_type"] = [TRANSFORMERS_BLOCK_TYPES[c] for c in pattern]
        data.pop("num_hidden_layers")
        data["head_dim"] = self.attention_head_dim
        return data


@dataclass(frozen=True)
class VLConfig:
    """The top-level Nano-Nemotron VL config, as far as the multimodal wrapper reads it.

    Attributes:
        hidden_size: the language model's width ``h`` (``text_config.hidden_size``).
        text_config: the language model's config, when the wrapper carries one (it must then
            agree with ``hidden_size`` and ``vocab_size``).
        vocab_size: the language model's vocabulary size.
        vit_hidden_size: the vision tower's width ``C``.
        projector_hidden_size: the width of ``mlp1``'s hidden layer.
        force_image_size: the side ``S`` of a static tile, in pixels.
        patch_size: the vision patch side ``P``, in pixels.
        downsample_ratio: pixel-shuffle ratio; the shuffle factor is ``r = round(1 / ratio)``.
        ps_version: ``"v2"`` (normal) or ``"v1"`` (legacy, transposed output).
        video_temporal_patch_size: frames per tubelet ``T``; ``T > 1`` embeds tubelets.
        dynamic_resolution: images arrive at their own size (``min_num_patches`` in the
            vision args) instead of as ``S x S`` tiles.
        has_audio: the checkpoint carries a ``sound_config`` (an audio tower).
        video_pruning_rate: EVS, a serving option (vLLM's ``--video-pruning-rate``): the
            fraction of each video's tokens the model drops, in ``[0, 1)``; 0 keeps every
            token (:mod:`reference_impl.evs`).
        max_audio_duration_s: a serving option (vLLM's ``VLLM_MAX_AUDIO_DECODE_DURATION_S``):
            the longest audio track the processor decodes from a video file, in seconds.
    """

    hidden_size: int
    vocab_size: int
    vit_hidden_size: int
    projector_hidden_size: int
    force_image_size: int = 512
    patch_size: int = 16
    downsample_ratio: float = 0.5
    ps_version: str = "v2"
    video_temporal_patch_size: int = 1
    dynamic_resolution: bool = False
    has_audio: bool = False
    text_config: NemotronHConfig | None = None
    vision_config: RadioConfig | None = None
    sound_config: AudioConfig | None = None
    use_thumbnail: bool = True
    max_num_tiles: int = 12
    norm_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    norm_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    min_num_patches: int = 1
    max_num_patches: int = 0  # 0: no cap
    max_model_len: int = 4096
    video_target_num_patches: int | None = None
    video_maintain_aspect_ratio: bool = False
    video_pruning_rate: float = 0.0
    max_audio_duration_s: float = 600.0
    # Derived in __post_init__.
    shuffle_factor: int = field(init=False)
    num_image_token: int = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "vocab_size",
            "vit_hidden_size",
            "projector_hidden_size",
            "force_image_size",
            "patch_size",
            "video_temporal_patch_size",
        ):
            _positive_int(name, getattr(self, name))
        if not 0.0 < self.downsample_ratio <= 1.0:
            raise ConfigError("downsample_ratio", "a float in (0, 1]", self.downsample_ratio)
        r = round(1 / self.downsample_ratio)
        if not math.isclose(r * self.downsample_ratio, 1.0):
            raise ConfigError(
                "downsample_ratio", "the reciprocal of an integer", self.downsample_ratio
            )
        vision = self.vision_config
        if vision is not None:
            for name, mine in (
                ("vit_hidden_size", vision.hidden_size),
                ("patch_size", vision.patch_size),
                ("video_temporal_patch_size", vision.video_temporal_patch_size),
            ):
                if getattr(self, name) != mine:
                    raise ConfigError(name, f"vision_config's {mine}", getattr(self, name))
        if self.sound_config is not None:
            if not self.has_audio:
                object.__setattr__(self, "has_audio", True)
            if self.sound_config.llm_hidden_size != self.hidden_size:
                raise ConfigError(
                    "sound_config.llm_hidden_size",
                    f"hidden_size={self.hidden_size}",
                    self.sound_config.llm_hidden_size,
                )
        if not self.max_num_tiles >= 1:
            raise ConfigError("max_num_tiles", "a positive int", self.max_num_tiles)
        check_rate(self.video_pruning_rate)
        cap = self.max_audio_duration_s
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not cap > 0:
            raise ConfigError("max_audio_duration_s", "a positive number of seconds", cap)
        text = self.text_config
        if text is not None:
            for name in ("hidden_size", "vocab_size"):
                if getattr(text, name) != getattr(self, name):
                    raise ConfigError(
                        name, f"text_config.{name}={getattr(text, name)}", getattr(self, name)
                    )
        if self.ps_version not in ("v1", "v2"):
            raise ConfigError("ps_version", "'v1' or 'v2'", self.ps_version)
        if self.force_image_size % self.patch_size != 0:
            raise ConfigError(
                "force_image_size",
                f"a multiple of patch_size={self.patch_size}",
                self.force_image_size,
            )
        grid = self.force_image_size // self.patch_size
        if grid % r != 0:
            raise ConfigError(
                "force_image_size",
                f"a patch grid ({grid}) divisible by the shuffle factor {r}",
                self.force_image_size,
            )
        # Frozen dataclass: derived fields are set through object.__setattr__.
        object.__setattr__(self, "shuffle_factor", r)
        object.__setattr__(self, "num_image_token", (grid // r) ** 2)

    @property
    def vision_final_layernorm(self) -> bool:
        """vLLM 0.33.0: a LayerNorm on the vision features before the pixel shuffle when the
        language model has MTP layers (``num_nextn_predict_layers > 0``)."""
        return self.text_config is not None and self.text_config.num_nextn_predict_layers > 0

    @property
    def connector_in_size(self) -> int:
        """Width of the pixel-shuffled features entering ``mlp1``: ``C * r * r``."""
        return self.vit_hidden_size * self.shuffle_factor**2
