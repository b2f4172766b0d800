"""Tiny checkpoint folders that a user could point vLLM at, written from the reference.

One function, :func:`write_checkpoint`, writes a folder a serving engine reads as it reads a
real checkpoint: ``config.json`` in the checkpoint's top-level form (``auto_map`` to the
configuration module in ``fixtures/checkpoint/``, loaded with ``trust_remote_code``), the
tokenizer files of our in-code tokenizer with the model's special tokens, and
``model.safetensors`` in checkpoint naming. Every tensor is random (norms and biases too), so a
tensor loaded under the wrong name cannot match by accident, and scaled as trained networks are
(:func:`_random_like`), so every tower's output depends on its input in bf16.

:class:`ModelSpec` names a variant: the language model's shape (V2: Mamba, MLP and attention
layers; Omni: Mamba, MoE and attention layers), static tiles or dynamic resolution, with or
without audio, the video temporal patch ``T``, MTP layers, an ``fp8`` checkpoint
(:func:`fp8_checkpoint`: its ``quantization_config`` names modules as the checkpoint does). The
vision tower is RADIO ``vit_small_patch16_224`` (384 wide, 12 layers): vLLM sizes RADIO from its
model-name table with no depth override on this path, and this is the smallest entry.

One command writes a folder for a person (the findings' reproductions run against it with vLLM
alone), and LoRA adapter folders for it (:func:`write_adapter_folder`)::

    python -m harness.checkpoint DIR [--dynamic] [--max-model-len N] [--adapter NAME ADIR ...]
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from harness import ROOT
from harness.shared_checkpoints import SHARED_FOLDERS_ENV
from reference_impl import presets
from reference_impl.audio import AudioConfig
from reference_impl.checkpoint import checkpoint_state_dict, read_weights, vl_config_to_hf_dict
from reference_impl.config import VLConfig
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.radio import RADIO_SIZES
from reference_impl.shrink import minimal_vl_config
from reference_impl.tokenizer import VOCAB_SIZE, build_tokenizer, build_tokenizer_object
from reference_impl.weights import CONV_BIAS_SUFFIXES

CONFIG_MODULE = ROOT / "fixtures" / "checkpoint" / "configuration_nano_nemotron_vl.py"
RADIO_MODEL = "vit_small_patch16_224"
AUTO_CONFIG = f"{CONFIG_MODULE.stem}.NanoNemotronVLConfig"


#: Static tiles per image when the engine is not told otherwise (vLLM's and the reference's).
DEFAULT_MAX_NUM_TILES = 12
#: The dtypes a checkpoint folder can be saved in (``ModelSpec.checkpoint_dtype``).
CHECKPOINT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_CHANGED_FIELD_SLUGS = (
    ("max_num_tiles", "tiles"),
    ("video_pruning_rate", "evs"),
    ("hidden_size", "d"),
    ("image_size", "px"),
    ("projector_hidden_size", "proj"),
    ("num_mel_bins", "mel"),
)


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
    quantization: Literal["none", "fp8"] = "none"  # "fp8": see :func:`fp8_checkpoint`
    # The dtype the folder's weights are saved in (its config's ``torch_dtype``): vLLM's
    # ``--dtype auto`` serves a bf16 folder in bf16, an fp32 one in its platform's half precision.
    checkpoint_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    # A serving option, not a checkpoint field: the engine-level limit of static tiles per
    # image (vLLM's processor option `max_num_tiles`, default 12), see `processor_options`.
    max_num_tiles: int = DEFAULT_MAX_NUM_TILES
    # A serving option too: EVS, the fraction of each video's tokens the model drops (vLLM's
    # `--video-pruning-rate`). Left unchecked here on purpose: the target must refuse a rate
    # outside [0, 1) itself, and the checks send some.
    video_pruning_rate: float = 0.0

    # Sizes shared by every variant.
    hidden_size: int = 64
    image_size: int = 64  # a static tile's side: a 4 x 4 patch grid, 4 embedding rows
    projector_hidden_size: int = 64
    num_mel_bins: int = 16

    def __post_init__(self) -> None:
        if self.language_model not in ("v2", "omni"):
            raise ValueError(
                f"ModelSpec.language_model: expected 'v2' or 'omni', got {self.language_model!r}"
            )
        if self.video_temporal_patch_size not in (1, 2):
            raise ValueError(
                "ModelSpec.video_temporal_patch_size: expected 1 or 2, got "
                f"{self.video_temporal_patch_size!r}"
            )
        if self.quantization not in ("none", "fp8"):
            raise ValueError(
                f"ModelSpec.quantization: expected 'none' or 'fp8', got {self.quantization!r}"
            )
        if not 1 <= self.max_num_tiles <= DEFAULT_MAX_NUM_TILES:
            raise ValueError(
                f"ModelSpec.max_num_tiles: expected 1..{DEFAULT_MAX_NUM_TILES}, got "
                f"{self.max_num_tiles!r}"
            )
        if self.checkpoint_dtype not in CHECKPOINT_DTYPES:
            raise ValueError(
                f"ModelSpec.checkpoint_dtype: expected one of {sorted(CHECKPOINT_DTYPES)}, got "
                f"{self.checkpoint_dtype!r}"
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
    vision = {
        "model_name": RADIO_MODEL,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "mlp_size": mlp,
        "patch_size": spec.patch_size,
        "image_size": spec.image_size,
        "cpe_max_size": 256,
        "register_multiple": 8,
        "video_temporal_patch_size": spec.video_temporal_patch_size,
    }
    sound = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "subsampling_conv_channels": 8,
        "projection_hidden_size": 48,
        "num_mel_bins": spec.num_mel_bins,
        "conv_kernel_size": 5,
        "hop_length": spec.audio_hop_length,
        "convolution_bias": spec.audio_convolution_bias,
    }
    overrides: dict[str, object] = {
        "text_config": text,
        "vision_config": vision,
        "projector_hidden_size": spec.projector_hidden_size,
        "force_image_size": spec.image_size,
        "max_model_len": spec.max_model_len,
        "dynamic_resolution": spec.dynamic_resolution,
        "min_num_patches": 1,
        "max_num_patches": 64 if spec.dynamic_resolution else 0,
        "max_num_tiles": spec.max_num_tiles,
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


# ---------------------------------------------------------------------------------------------
# Weights


def _random_like(name: str, tensor: torch.Tensor, seed: int) -> torch.Tensor:
    """A random tensor for ``name``, drawn from ``seed`` and the name alone, scaled as a trained
    network's are, so that every layer's output depends on its input in bf16 as in fp32:

    - a weight of two or more dimensions (linear, convolution, embedding) ``N(0, 1 / fan_in)``,
      ``fan_in`` the product of its dimensions after the first: each layer keeps its input's
      scale, so the signal reaches the output (a fixed 0.02 shrank it by 10x per layer of
      Parakeet's subsampling, until the biases swamped it and bf16 rounded it away);
    - a one-dimensional weight (every one here is a normalisation's scale) ``1 + N(0, 0.01)``;
      a BatchNorm's running variance ``1 + |N(0, 0.01)|``;
    - a bias ``N(0, 0.02^2)``: small beside the O(1) activations it is added to;
    - anything else (Mamba's ``A_log``, ``D``, ``dt_bias``; RADIO's position embeddings and
      class tokens; Parakeet's relative-position biases; a running mean) ``N(0, 0.1^2)`` in one
      dimension, ``N(0, 0.02^2)`` in more.

    Norm scales and biases are random too, so a tensor loaded under the wrong name cannot match
    by accident."""
    if not tensor.is_floating_point():
        return tensor.clone()
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    noise = torch.randn(tensor.shape, generator=g, dtype=torch.float32)
    if name.endswith("running_var"):
        return 1.0 + 0.1 * noise.abs()
    if name.endswith(".weight"):
        if tensor.dim() == 1:
            return 1.0 + 0.1 * noise
        fan_in = math.prod(tensor.shape[1:])
        return noise / math.sqrt(fan_in)
    if name.endswith(".bias"):
        return 0.02 * noise
    return noise * (0.1 if tensor.dim() <= 1 else 0.02)


def _model_tensors(config: VLConfig, seed: int) -> dict[str, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NanoNemotronVLForConditionalGeneration(config, build_tokenizer())
    return checkpoint_state_dict(model)


def random_checkpoint(config: VLConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """The reference model of ``config`` with every tensor random, in checkpoint naming; with
    ``convolution_bias = False`` the Parakeet convolution biases are written all the same, as
    released checkpoints carry them."""
    weights = _model_tensors(config, seed)
    sound = config.sound_config
    if sound is not None and not sound.convolution_bias:
        with_bias = dataclasses.replace(
            config, sound_config=dataclasses.replace(sound, convolution_bias=True)
        )
        weights |= {
            name: t
            for name, t in _model_tensors(with_bias, seed).items()
            if name.endswith(CONV_BIAS_SUFFIXES)
        }
    return {name: _random_like(name, t, seed) for name, t in weights.items()}


# ---------------------------------------------------------------------------------------------
# Quantization

#: The language model's linear layers, by the last component of their checkpoint module name.
LM_LINEARS = ("in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")
#: The ones an ``fp8`` checkpoint keeps unquantized: each layer kind's input projections (q, k and
#: v together: vLLM fuses them). The output projections are fp8.
FP8_KEPT = ("in_proj", "q_proj", "k_proj", "v_proj", "up_proj")
FP8_MAX = 448.0  # the largest float8_e4m3fn


def fp8_checkpoint(
    weights: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """``weights`` as an ``fp8`` checkpoint (vLLM's ``Fp8Config`` form), and its
    ``quantization_config``.

    The language model's output projections (:data:`LM_LINEARS` not in :data:`FP8_KEPT`) are
    ``float8_e4m3fn`` with a per-tensor ``weight_scale``; every other tensor is unchanged.
    ``ignored_layers`` names, by their checkpoint names (``language_model.backbone.*``, as released
    checkpoints do), each language-model linear kept unquantized, the LM head, and every 2-D
    weight of the towers and the connector: what a reader must not quantize. Activations are
    quantized dynamically."""
    out: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for name, tensor in weights.items():
        module, _, leaf = name.rpartition(".")
        kind = module.rsplit(".", 1)[-1]
        in_layers = module.startswith("language_model.backbone.layers.") and kind in LM_LINEARS
        if leaf == "weight" and in_layers and kind not in FP8_KEPT:
            scale = tensor.float().abs().amax().clamp_min(1e-12) / FP8_MAX
            out[name] = (tensor.float() / scale).to(torch.float8_e4m3fn)
            out[f"{module}.weight_scale"] = scale
            continue
        if leaf == "weight" and (
            in_layers
            or module == "language_model.lm_head"
            or (tensor.dim() == 2 and not name.startswith("language_model."))
        ):
            ignored.append(module)
        out[name] = tensor
    config: dict[str, object] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": sorted(ignored),
    }
    return out, config


# ---------------------------------------------------------------------------------------------
# The folder


def write_tokenizer(folder: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the in-code tokenizer."""
    build_tokenizer_object().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
            },
            indent=2,
        )
    )


def write_checkpoint(
    spec: ModelSpec, folder: Path, *, seed: int = 0, dtype: torch.dtype | None = None
) -> Path:
    """Write the checkpoint folder of ``spec`` into ``folder`` (created); returns it. Its
    weights are saved in ``dtype``, by default the spec's ``checkpoint_dtype``."""
    from safetensors.torch import save_file

    dtype = CHECKPOINT_DTYPES[spec.checkpoint_dtype] if dtype is None else dtype
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = spec.vl_config()
    dtype_name = str(dtype).removeprefix("torch.")
    data = vl_config_to_hf_dict(config)
    data["auto_map"] = {"AutoConfig": AUTO_CONFIG}
    data["torch_dtype"] = dtype_name
    data["text_config"]["torch_dtype"] = dtype_name
    shutil.copyfile(CONFIG_MODULE, folder / CONFIG_MODULE.name)
    write_tokenizer(folder)
    weights = {
        name: (t.to(dtype) if t.is_floating_point() else t)
        for name, t in random_checkpoint(config, seed).items()
    }
    if spec.quantization == "fp8":
        weights, data["quantization_config"] = fp8_checkpoint(weights)
    (folder / "config.json").write_text(json.dumps(data, indent=2))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


_FOLDERS: dict[tuple[ModelSpec, int], Path] = {}
_FOLDERS_LOCK = threading.RLock()
_TEMP_ROOT: list[Path] = []

#: The code a folder's bytes depend on.
_WRITER_SOURCES = (
    Path(__file__),
    CONFIG_MODULE,
    *sorted((ROOT / "reference_impl").rglob("*.py")),
)


@functools.cache
def writer_digest() -> str:
    """A digest of the code that writes the folders (:data:`_WRITER_SOURCES`)."""
    digest = hashlib.sha256()
    for path in _WRITER_SOURCES:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _shared_folder(root: Path, spec: ModelSpec, seed: int) -> Path:
    """``spec``'s folder under the shared ``root``: written once by whichever process needs it
    first, into a private folder renamed into place when complete, so that a reader never sees
    half a folder and two writers at once both leave a whole one."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"{SHARED_FOLDERS_ENV}: expected an existing folder, got {str(root)!r}"
        )
    final = root / f"{spec.slug}-seed{seed}-{writer_digest()}"
    if final.is_dir():
        return final
    private = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    write_checkpoint(spec, private, seed=seed)
    try:
        private.rename(final)
    except OSError:  # another process renamed its copy first: the same bytes
        shutil.rmtree(private, ignore_errors=True)
        if not final.is_dir():
            raise
    return final


def write_new_folders_under(root: Path) -> None:
    """Write the folders not written yet under ``root`` from now on (the caller removes it):
    a forked child, which exits without running the parent's exit handlers, keeps the
    parent's folders and writes its own where it will remove them. Folders shared through
    :data:`SHARED_FOLDERS_ENV` are still read from and written to the shared folder."""
    with _FOLDERS_LOCK:
        root.mkdir(parents=True, exist_ok=True)
        _TEMP_ROOT[:] = [root]


def checkpoint_folder(spec: ModelSpec, seed: int = 0) -> Path:
    """The folder of ``spec``, written once per process into a temporary root removed at exit,
    or once per run into the folder :data:`SHARED_FOLDERS_ENV` names."""
    spec = spec.checkpoint
    with _FOLDERS_LOCK:
        key = (spec, seed)
        if key not in _FOLDERS:
            shared = os.environ.get(SHARED_FOLDERS_ENV)
            if shared:
                _FOLDERS[key] = _shared_folder(Path(shared), spec, seed)
                return _FOLDERS[key]
            if not _TEMP_ROOT:
                root = Path(tempfile.mkdtemp(prefix="nemotron-vl-checkpoints-"))
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _TEMP_ROOT.append(root)
            folder = _TEMP_ROOT[0] / f"{spec.slug}-seed{seed}"
            _FOLDERS[key] = write_checkpoint(spec, folder, seed=seed)
        return _FOLDERS[key]


_WEIGHTS: dict[tuple[ModelSpec, int], dict[str, torch.Tensor]] = {}


def checkpoint_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """The tensors of ``spec``'s folder by checkpoint name, read once per process: each call
    gives a new dict (change it freely), the tensors are shared (never change them in place)."""
    spec = spec.checkpoint
    with _FOLDERS_LOCK:
        key = (spec, seed)
        if key not in _WEIGHTS:
            _WEIGHTS[key] = read_weights(checkpoint_folder(spec, seed))
        return dict(_WEIGHTS[key])


# ---------------------------------------------------------------------------------------------
# The command

#: ``--adapter`` names a broken adapter ``broken-<kind>``, one of ``BROKEN_ADAPTERS``'s kinds.
BROKEN_PREFIX = "broken-"
#: The ``--max-lora-rank`` a broken adapter is broken for (its ``rank-above-max`` kind: rank 16).
BROKEN_FOR_MAX_LORA_RANK = 8


def adapter_names() -> list[str]:
    """What ``--adapter`` writes: each adapter of :mod:`harness.lora_adapters` by name, and each
    broken kind as ``broken-<kind>``."""
    from harness.lora_adapters import ADAPTERS, BROKEN_ADAPTERS

    return [a.name for a in ADAPTERS] + [BROKEN_PREFIX + kind for kind in BROKEN_ADAPTERS]


def write_adapter_folder(spec: ModelSpec, name: str, folder: Path) -> Path:
    """Write the PEFT folder of the adapter :func:`adapter_names` calls ``name``, for ``spec``'s
    checkpoint, into ``folder`` (created); returns it."""
    from harness.lora_adapters import ADAPTERS_BY_NAME, write_adapter, write_broken_adapter

    if name.startswith(BROKEN_PREFIX):
        kind = name.removeprefix(BROKEN_PREFIX)
        return write_broken_adapter(spec, kind, Path(folder), BROKEN_FOR_MAX_LORA_RANK)
    if name not in ADAPTERS_BY_NAME:
        raise ValueError(
            f"write_adapter_folder: name: expected one of {adapter_names()}, got {name!r}"
        )
    return write_adapter(spec.checkpoint, ADAPTERS_BY_NAME[name], Path(folder))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.checkpoint DIR [--dynamic] [--max-model-len N] [--checkpoint-dtype D]
    [--adapter NAME ADIR]``: write the tiny checkpoint folder into ``DIR`` (and each named LoRA
    adapter's folder for it into its ``ADIR``), and print each folder's path, one a line."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.checkpoint",
        description="Write a tiny Nano-Nemotron VL checkpoint folder that vLLM reads as it reads "
        "a real one (config.json with its configuration module, tokenizer, random bf16 or fp32 "
        "model.safetensors), and LoRA adapter folders for it.",
    )
    parser.add_argument("folder", type=Path, metavar="DIR", help="the checkpoint folder to write")
    parser.add_argument(
        "--dynamic", action="store_true", help="dynamic-resolution images (default: static tiles)"
    )
    default_len = ModelSpec().max_model_len
    parser.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=default_len,
        metavar="N",
        help=f"the context the config states (max_sequence_length; default {default_len})",
    )
    parser.add_argument(
        "--checkpoint-dtype",
        choices=sorted(CHECKPOINT_DTYPES),
        default=ModelSpec().checkpoint_dtype,
        help="the dtype the weights are saved in, and the config's torch_dtype (default: "
        "%(default)s; vLLM's --dtype auto serves a float32 checkpoint in bfloat16)",
    )
    parser.add_argument(
        "--adapter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "ADIR"),
        help="also write LoRA adapter NAME for this checkpoint into ADIR (repeatable); NAME is one "
        f"of {', '.join(adapter_names())} (broken-*: broken for --max-lora-rank "
        f"{BROKEN_FOR_MAX_LORA_RANK})",
    )
    args = parser.parse_args(argv)
    names = adapter_names()
    for name, _ in args.adapter:
        if name not in names:
            parser.error(f"argument --adapter: NAME: expected one of {names}, got {name!r}")
    folders = [args.folder, *(Path(d) for _, d in args.adapter)]
    for path in folders:
        if path.exists() and not path.is_dir():
            parser.error(f"{str(path)!r} exists and is not a folder")
    try:
        spec = ModelSpec(
            dynamic_resolution=args.dynamic,
            max_model_len=args.max_model_len,
            checkpoint_dtype=args.checkpoint_dtype,
        )
    except ValueError as e:
        parser.error(str(e))
    folder = write_checkpoint(spec, args.folder).resolve()
    print(folder)
    key = (spec.checkpoint, 0)
    with _FOLDERS_LOCK:  # the adapters read this folder's tensors rather than write another
        before = _FOLDERS.get(key)
        _FOLDERS[key] = folder
        try:
            for name, adapter_dir in args.adapter:
                print(write_adapter_folder(spec, name, Path(adapter_dir)).resolve())
        finally:
            if before is None:
                del _FOLDERS[key]
            else:
                _FOLDERS[key] = before
    return 0


if __name__ == "__main__":
    # Through the package's module, not this copy run as __main__: the adapter writers read the
    # folder just written from the package module's cache.
    from harness import checkpoint

    sys.exit(checkpoint.main())
