"""The checkpoint folder: a top-level ``config.json`` and weights in checkpoint naming.

A Nano-Nemotron VL checkpoint folder holds ``config.json`` (``model_type``
``NemotronH_Nano_VL_V2``: the wrapper's fields at the top level, the language model in
``text_config``, RADIO in ``vision_config``, Parakeet in ``sound_config``) and safetensors files
whose tensor names are the checkpoint's:

- ``language_model.backbone.*`` (q/k/v separate, experts one by one): the language model;
- ``vision_model.radio_model.model.*``: RADIO (``patch_generator.cls_token.token``);
- ``mlp1.{0,1,3}.weight``: the connector; ``vision_projector.vision_final_layernorm.*`` when the
  language model has MTP layers;
- ``sound_encoder.encoder.*`` and ``sound_projection.{norm,linear1,linear2}.*``: Parakeet.

This module holds the checkpoint's naming, both ways, and reads and writes that form for the
reference: :func:`vl_config_to_hf_dict` / :func:`vl_config_from_hf_dict`;
:func:`checkpoint_state_dict` (the model's weights under those names) and its inverse
:func:`load_vl_checkpoint` (routing each name to its module, the language model's tensors
through :mod:`reference_impl.weights`); :func:`load_folder`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from reference_impl.audio import AudioConfig
from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.errors import ConfigError
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.radio import RADIO_SIZES, RadioConfig, RadioVisionModel
from reference_impl.weights import EXPERT_WEIGHT, WeightLoadError, load_state_dict

ARCHITECTURE = "NemotronH_Nano_VL_V2"
#: The connector's LayerNorm, as checkpoints trained with MTP name it.
VISION_NORM_PREFIX = "vision_projector.vision_final_layernorm."
#: ``sound_projection.<part>`` names of the projection's layers, by ``nn.Sequential`` index.
SOUND_PROJECTION_PARTS = {"0": "norm", "1": "linear1", "3": "linear2"}
#: The projection's ``nn.Sequential`` index of each checkpoint name (the table above inverted).
SOUND_PROJECTION_INDEX = {part: index for index, part in SOUND_PROJECTION_PARTS.items()}
#: Checkpoint prefixes of the towers and the connector (skipped in text-only mode).
TOWER_PREFIXES: tuple[str, ...] = (
    "vision_model.",
    "mlp1.",
    "vision_projector.",
    "sound_encoder.",
    "sound_projection.",
)
#: Parakeet's convolution biases: absent from the encoder when ``convolution_bias = False``, yet
#: carried by released checkpoints of that config (vLLM #40007 skips them when loading).
CONV_BIAS_SUFFIXES = (
    ".conv.pointwise_conv1.bias",
    ".conv.depthwise_conv.bias",
    ".conv.pointwise_conv2.bias",
)
#: Top-level fields of ``config.json`` that are :class:`VLConfig` fields of the same name.
TOP_LEVEL_FIELDS = (
    "force_image_size",
    "patch_size",
    "downsample_ratio",
    "ps_version",
    "vit_hidden_size",
    "projector_hidden_size",
    "use_thumbnail",
    "norm_mean",
    "norm_std",
)
#: ``vision_config.args`` keys a RADIO config carries beyond the model name.
RADIO_ARGS = ("cpe_max_size", "register_multiple")
#: RADIO's blocks' LayerNorm epsilon when ``vision_config.args`` names none (timm's ViT).
RADIO_LAYER_NORM_EPS = 1e-6


def vl_config_to_hf_dict(config: VLConfig) -> dict[str, Any]:
    """``config.json``'s content for ``config`` (the checkpoint's top-level form)."""
    if config.text_config is None or config.vision_config is None:
        raise ConfigError("text_config / vision_config", "both set", "missing")
    vision = config.vision_config
    if (vision.hidden_size, vision.num_layers, vision.num_heads, vision.mlp_size) != RADIO_SIZES[
        vision.model_name
    ]:
        raise ConfigError(
            "vision_config",
            f"the sizes of {vision.model_name} (a checkpoint names RADIO's size by model name)",
            (vision.hidden_size, vision.num_layers, vision.num_heads, vision.mlp_size),
        )
    args: dict[str, Any] = {"model": vision.model_name}
    args.update({name: getattr(vision, name) for name in RADIO_ARGS})
    if vision.layer_norm_eps != RADIO_LAYER_NORM_EPS:  # timm's default is left unwritten
        args["layer_norm_eps"] = vision.layer_norm_eps
    if config.dynamic_resolution:
        args.update(min_num_patches=config.min_num_patches, max_num_patches=config.max_num_patches)
    data: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": ARCHITECTURE,
        "template": "nemotron-h-5p5",
        "image_tag_type": "internvl",
        "max_sequence_length": config.max_model_len,
        **{name: _plain(getattr(config, name)) for name in TOP_LEVEL_FIELDS},
        "text_config": config.text_config.to_hf_dict()
        | {"architectures": ["NemotronHForCausalLM"]},
        "vision_config": {
            "model_type": "radio",
            "args": args,
            "patch_size": vision.patch_size,
            "preferred_resolution": [vision.image_size, vision.image_size],
            "video_temporal_patch_size": vision.video_temporal_patch_size,
            "separate_video_embedder": vision.separate_video_embedder,
            "layer_norm_eps": vision.final_layernorm_eps,
            "video_maintain_aspect_ratio": config.video_maintain_aspect_ratio,
        },
    }
    if config.video_target_num_patches is not None:
        data["vision_config"]["video_target_num_patches"] = config.video_target_num_patches
    if config.sound_config is not None:
        sound = config.sound_config
        data["sound_config"] = {
            "model_type": "parakeet_encoder",
            **sound.encoder_fields(),
            "projection_hidden_size": sound.projection_hidden_size,
            "projection_bias": sound.projection_bias,
            "projection_eps": sound.projection_eps,
            "sampling_rate": sound.sampling_rate,
            "hop_length": sound.hop_length,
        }
    return data


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def vl_config_from_hf_dict(data: Mapping[str, Any]) -> VLConfig:
    """The reference's config from ``config.json``'s content; every invalid or missing field
    raises :class:`ConfigError` naming it."""
    for key in ("text_config", "vision_config"):
        if not isinstance(data.get(key), Mapping):
            raise ConfigError(key, "a mapping", data.get(key))
    text = NemotronHConfig.from_hf_dict(data["text_config"])
    vision_data = data["vision_config"]
    args = vision_data.get("args")
    if not isinstance(args, Mapping) or "model" not in args:
        raise ConfigError("vision_config.args", "a mapping with 'model'", args)
    resolution = vision_data.get("preferred_resolution") or [224, 224]
    temporal = int(vision_data.get("video_temporal_patch_size", 1))
    vision = RadioConfig.from_model_name(
        args["model"],
        image_size=int(resolution[0]),
        patch_size=int(vision_data.get("patch_size", 16)),
        layer_norm_eps=float(args.get("layer_norm_eps", RADIO_LAYER_NORM_EPS)),
        final_layernorm_eps=float(vision_data.get("layer_norm_eps", 1e-6)),
        video_temporal_patch_size=temporal,
        separate_video_embedder=bool(vision_data.get("separate_video_embedder", True)),
        **{name: args[name] for name in RADIO_ARGS if name in args},
    )
    sound: AudioConfig | None = None
    if data.get("sound_config") is not None:
        sound_data = data["sound_config"]
        names = {f.name for f in dataclasses.fields(AudioConfig)}
        sound = AudioConfig(
            llm_hidden_size=text.hidden_size,
            **{k: v for k, v in sound_data.items() if k in names and k != "llm_hidden_size"},
        )
    top: dict[str, Any] = {}
    for name in TOP_LEVEL_FIELDS:
        if name in data:
            value = data[name]
            top[name] = tuple(value) if isinstance(value, list) else value
    dynamic = "min_num_patches" in args
    return VLConfig(
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        text_config=text,
        vision_config=vision,
        sound_config=sound,
        video_temporal_patch_size=temporal,
        dynamic_resolution=dynamic,
        min_num_patches=int(args.get("min_num_patches", 1)),
        max_num_patches=int(args.get("max_num_patches", 0)),
        max_model_len=int(data.get("max_sequence_length", 4096)),
        video_target_num_patches=_video_target_num_patches(vision_data),
        video_maintain_aspect_ratio=bool(vision_data.get("video_maintain_aspect_ratio", False)),
        **top,
    )


def _video_target_num_patches(vision_data: Mapping[str, Any]) -> int | None:
    """The patches a video frame is resized to: ``video_target_num_patches``, or the square
    grid of ``video_target_img_size`` pixels (at most one of the two may be set)."""
    patches = vision_data.get("video_target_num_patches")
    side = vision_data.get("video_target_img_size")
    if patches is not None and side is not None:
        raise ConfigError(
            "vision_config.video_target_num_patches / video_target_img_size",
            "at most one of the two",
            f"both ({patches!r}, {side!r})",
        )
    if side is not None:
        if not isinstance(side, int) or side < 1:
            raise ConfigError("vision_config.video_target_img_size", "a positive int", side)
        per_side = math.ceil(side / int(vision_data.get("patch_size", 16)))
        return per_side * per_side
    if patches is not None and (not isinstance(patches, int) or patches < 1):
        raise ConfigError("vision_config.video_target_num_patches", "a positive int", patches)
    return patches


def checkpoint_state_dict(model: NanoNemotronVLForConditionalGeneration) -> dict[str, torch.Tensor]:
    """The model's weights in checkpoint naming (what :func:`load_vl_checkpoint` reads), each
    its own contiguous copy."""
    return {name: t.detach().clone().contiguous() for name, t in _checkpoint_views(model).items()}


def _checkpoint_views(model: NanoNemotronVLForConditionalGeneration) -> dict[str, torch.Tensor]:
    """The model's weights by checkpoint name, as views of its own tensors (split ``qkv`` and
    per-expert pieces included)."""
    out: dict[str, torch.Tensor] = {}
    text = model.config.text_config
    assert text is not None  # the whole model is built with one
    q = text.num_attention_heads * text.attention_head_dim
    kv = text.num_key_value_heads * text.attention_head_dim
    for name, tensor in model.language_model.state_dict().items():
        name = name.replace("model.", "backbone.", 1).replace(".embed_tokens.", ".embeddings.")
        if ".qkv_proj." in name:
            for part, piece in zip("qkv", tensor.split([q, kv, kv]), strict=True):
                out[f"language_model.{name.replace('qkv_proj', f'{part}_proj')}"] = piece
        elif ".mixer.experts." in name and name.endswith(("up_proj", "down_proj")):
            prefix, proj = name.rsplit(".", 1)
            for j, expert in enumerate(tensor.unbind(0)):
                out[f"language_model.{prefix}.{j}.{proj}.weight"] = expert
        else:
            out[f"language_model.{name}"] = tensor
    mm = model.multimodal
    vision: nn.Module = cast(nn.Module, mm.vision_model)  # RADIO, behind the VisionTower protocol
    for name, tensor in vision.state_dict().items():
        name = name.replace("patch_generator.cls_token", "patch_generator.cls_token.token")
        out[f"vision_model.radio_model.model.{name}"] = tensor
    for name, tensor in mm.connector.state_dict().items():
        if name.startswith("vision_final_layernorm."):
            out[VISION_NORM_PREFIX + name.removeprefix("vision_final_layernorm.")] = tensor
        else:
            out[name] = tensor
    if mm.sound_encoder is not None:
        tower = cast(nn.Module, mm.sound_encoder)  # Parakeet, behind the SoundEncoder protocol
        for name, tensor in tower.state_dict().items():
            if name.startswith("projection."):
                index, rest = name.removeprefix("projection.").split(".", 1)
                out[f"sound_projection.{SOUND_PROJECTION_PARTS[index]}.{rest}"] = tensor
            else:
                out[f"sound_encoder.{name}"] = tensor
    return out


def copy_streamed(tensor: torch.Tensor) -> torch.Tensor:
    """A streamed tensor's own copy: the loader may reuse its buffer for the next tensor."""
    return tensor.detach().clone()


def load_vl_checkpoint(
    model: NanoNemotronVLForConditionalGeneration,
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    *,
    text_only: bool = False,
) -> None:
    """Load a whole Nano-Nemotron VL checkpoint (checkpoint naming), routing by prefix as vLLM's
    ``NemotronH_Nano_VL_V2.load_weights`` does:

    - ``language_model.*`` (``language_model.backbone.*`` too) -> the language model;
    - ``vision_model.radio_model.*`` -> RADIO; ``mlp1.{0,1,3}.*`` -> the connector;
      ``vision_projector.vision_final_layernorm.*`` when the config has it;
    - ``sound_encoder.encoder.*`` and ``sound_projection.{norm,linear1,linear2}.*`` -> Parakeet;
      with ``convolution_bias = False`` the convolutions' biases, which released checkpoints of
      that config still carry, are skipped (as vLLM does, #40007).

    ``weights`` may be streamed (``(name, tensor)`` pairs from a loader that reuses its buffers):
    each tensor is copied as it arrives, none is kept by reference. With ``text_only`` (every
    multimodal limit 0) the tower tensors are skipped by name, never read. Any other name, and
    any missing weight, raises."""
    groups: dict[str, dict[str, torch.Tensor]] = {
        "lm": {},
        "vision": {},
        "connector": {},
        "sound": {},
    }
    unexpected = []
    items = weights.items() if isinstance(weights, Mapping) else weights
    given: set[str] = set()
    for name, streamed in items:
        given.add(name)
        if text_only and name.startswith(TOWER_PREFIXES):
            continue
        tensor = copy_streamed(streamed)
        if name.startswith("language_model."):
            groups["lm"][name.removeprefix("language_model.")] = tensor
        elif name.startswith("vision_model.radio_model."):
            groups["vision"][name] = tensor
        elif name.startswith("mlp1."):
            groups["connector"][name] = tensor
        elif name.startswith("vision_projector.vision_final_layernorm."):
            groups["connector"][name.removeprefix("vision_projector.")] = tensor
        elif name.startswith("sound_encoder.encoder.feature_extractor."):
            continue  # extractor buffers: the features are computed outside the model
        elif name.startswith("sound_encoder.") and _bias_free_convolution(model, name):
            continue  # a bias the config's convolutions do not have (released files carry it)
        elif name.startswith("sound_encoder."):
            groups["sound"][name.removeprefix("sound_encoder.")] = tensor
        elif name.startswith("sound_projection."):
            part, _, rest = name.removeprefix("sound_projection.").partition(".")
            index = SOUND_PROJECTION_INDEX.get(part, part)
            groups["sound"][f"projection.{index}.{rest}"] = tensor
        else:
            unexpected.append(name)
    missing = _missing_checkpoint_names(model, given, text_only)
    if unexpected or missing:
        raise WeightLoadError(missing, sorted(unexpected), [])
    load_state_dict(model.language_model, groups["lm"])
    if text_only:
        return
    mm = model.multimodal
    if not isinstance(mm.vision_model, RadioVisionModel):
        raise TypeError("load_vl_checkpoint: the model's vision tower is not RADIO")
    mm.vision_model.load_checkpoint(groups["vision"])
    connector = {k.removeprefix("mlp1."): v for k, v in groups["connector"].items()}
    connector = {
        k if k.startswith("vision_final_layernorm.") else f"mlp1.{k}": v
        for k, v in connector.items()
    }
    _load_exact(mm.connector, connector, "connector")
    if mm.sound_encoder is not None:
        assert isinstance(mm.sound_encoder, nn.Module)
        _load_exact(mm.sound_encoder, groups["sound"], "sound")
    elif groups["sound"]:
        raise WeightLoadError([], sorted(f"sound_encoder.{k}" for k in groups["sound"]), [])


def _bias_free_convolution(model: NanoNemotronVLForConditionalGeneration, name: str) -> bool:
    """``name`` is a Parakeet convolution bias and the config's convolutions have none."""
    sound = model.config.sound_config
    return sound is not None and not sound.convolution_bias and name.endswith(CONV_BIAS_SUFFIXES)


def _missing_checkpoint_names(
    model: NanoNemotronVLForConditionalGeneration, given: set[str], text_only: bool
) -> list[str]:
    """The model's checkpoint tensors (by their checkpoint names) not in ``given``; names under
    ``language_model.model.`` stand for their ``language_model.backbone.`` twins, and a fused
    ``experts.up_proj`` / ``down_proj`` for its per-expert tensors."""

    def normal(name: str) -> str:
        if name.startswith("language_model.model."):
            name = "language_model.backbone." + name.removeprefix("language_model.model.")
        return name.replace(".embed_tokens.", ".embeddings.")

    present = {normal(name) for name in given}
    fused = {name.rsplit(".", 1)[0] for name in present if name.endswith(("up_proj", "down_proj"))}
    missing = []
    for name in _checkpoint_views(model):  # names only: no copies
        if (text_only and name.startswith(TOWER_PREFIXES)) or name in present:
            continue
        expert = EXPERT_WEIGHT.match(name.removeprefix("language_model."))
        if expert is not None and f"language_model.{expert['prefix']}" in fused:
            continue
        missing.append(name)
    return sorted(missing)


def _load_exact(module: nn.Module, weights: Mapping[str, torch.Tensor], what: str) -> None:
    """Parameters and persistent buffers (BatchNorm running statistics) of ``module``."""
    params = dict(module.state_dict(keep_vars=True))
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(f"{what}: {k}" for k in set(weights) - set(params))
    mis_shaped = [
        f"{what}: {k} (expected {tuple(params[k].shape)}, got {tuple(t.shape)})"
        for k, t in weights.items()
        if k in params and params[k].shape != t.shape
    ]
    if missing or unexpected or mis_shaped:
        raise WeightLoadError([f"{what}: {m}" for m in missing], unexpected, mis_shaped)
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)


def read_config(folder: Path) -> VLConfig:
    """The reference config of a checkpoint folder's ``config.json``."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError("config.json", f"a file in {folder}", "absent")
    return vl_config_from_hf_dict(json.loads(path.read_text()))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``*.safetensors`` files, by checkpoint name."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ConfigError("weights", f"*.safetensors files in {folder}", "none")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


#: The processor options an engine may start the reference with (the config fields they set).
PROCESSOR_OPTIONS = ("max_num_tiles", "min_num_patches", "max_num_patches")


def load_folder(
    folder: Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    dtype: torch.dtype = torch.float32,
    text_only: bool = False,
    max_num_tiles: int | None = None,
    video_pruning_rate: float = 0.0,
    processor_options: Mapping[str, object] | None = None,
    max_model_len: int | None = None,
) -> NanoNemotronVLForConditionalGeneration:
    """The reference model of a checkpoint folder, its weights loaded (every name checked),
    computing in ``dtype``.

    Serving options (no checkpoint field holds them): ``max_num_tiles``, a serving engine's
    limit of static tiles per image where it is given one (None keeps the config's);
    ``video_pruning_rate``, EVS's rate (:mod:`reference_impl.evs`); ``processor_options``, the
    processor's options an engine starts it with (:data:`PROCESSOR_OPTIONS`, over
    ``max_num_tiles``); ``max_model_len``, the engine's context (None: the config's)."""
    config = dataclasses.replace(read_config(folder), video_pruning_rate=video_pruning_rate)
    if max_num_tiles is not None:
        config = dataclasses.replace(config, max_num_tiles=max_num_tiles)
    options = dict(processor_options or {})
    unknown = sorted(set(options) - set(PROCESSOR_OPTIONS))
    if unknown:
        raise ConfigError("processor_options", f"keys of {list(PROCESSOR_OPTIONS)}", unknown)
    for key, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"processor_options.{key}", "a positive int", value)
    config = dataclasses.replace(config, **options)  # type: ignore[arg-type]
    if max_model_len is not None:
        config = dataclasses.replace(config, max_model_len=max_model_len)
    # Text-only, the towers keep their initial weights: only then are they drawn.
    with contextlib.nullcontext() if text_only else weights_left_uninitialized():
        model = NanoNemotronVLForConditionalGeneration(config, tokenizer)
    load_vl_checkpoint(model, read_weights(folder), text_only=text_only)
    return model.to(dtype).eval()


#: ``torch.nn.init``'s initializers, which torch's layers call as they are built.
INITIALIZERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
)
_INITIALIZERS_LOCK = threading.Lock()


def _leave(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def weights_left_uninitialized() -> Iterator[None]:
    """Build a model whose every weight is loaded next without drawing initial weights: torch's
    initializers do nothing inside (drawing them took a quarter of a model build). Process-wide:
    a layer another thread builds meanwhile is left uninitialized too."""
    with _INITIALIZERS_LOCK:
        saved = {name: getattr(nn.init, name) for name in INITIALIZERS}
        for name in INITIALIZERS:
            setattr(nn.init, name, _leave)
        try:
            yield
        finally:
            for name, initializer in saved.items():
                setattr(nn.init, name, initializer)
