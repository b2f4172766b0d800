"""Tiny checkpoint folders that a user could point vLLM at, written from the reference.

One function, :func:`write_checkpoint`, writes a folder a serving engine reads as it reads a
real checkpoint: ``config.json`` in the checkpoint's top-level form (``auto_map`` to the
configuration module in ``fixtures/checkpoint/``, loaded with ``trust_remote_code``), the
tokenizer files of our in-code tokenizer with the model's special tokens, and
``model.safetensors`` in checkpoint naming. Every tensor is random (norms and biases too), so a
tensor loaded under the wrong name cannot match by accident, and scaled as trained networks are
(:func:`_random_like`), so every tower's output depends on its input in bf16. An ``fp8``
variant's file is quantized as the checkpoint's is (:func:`fp8_checkpoint`: its
``quantization_config`` names modules as the checkpoint does).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import zlib
from pathlib import Path

import torch

from harness.checkpoints.spec import AUTO_CONFIG, CHECKPOINT_DTYPES, CONFIG_MODULE, ModelSpec
from reference_impl.checkpoint import (
    CONV_BIAS_SUFFIXES,
    checkpoint_state_dict,
    vl_config_to_hf_dict,
    weights_left_uninitialized,
)
from reference_impl.config import VLConfig
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.tokenizer import build_tokenizer, build_tokenizer_object

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
    """The model's tensors by checkpoint name; :func:`_random_like` draws every floating one
    anew, so their initial values are never drawn."""
    with weights_left_uninitialized():
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


#: The chat template the folder's tokenizer carries, as the published checkpoints carry one:
#: each message as ``<|im_start|>ROLE`` and its text on the next line, closed by
#: ``<|im_end|>``; the assistant's turn opened when asked. A message's media parts reach it as
#: the placeholders vLLM puts in its text (``<image>``, ``<video>``, ``<so_embedding>``).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` (with :data:`CHAT_TEMPLATE`) of the
    in-code tokenizer, and ``generation_config.json`` with its special tokens, as a published
    checkpoint ships them."""
    tokenizer = build_tokenizer_object()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": tokenizer.token_to_id("<s>"),
                "eos_token_id": tokenizer.token_to_id("</s>"),
                "_from_model_config": False,
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
