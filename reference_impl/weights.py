"""Loading NemotronH weights from a Hugging Face state dict (checkpoint or transformers naming).

Name mapping (as vLLM's ``NemotronHForCausalLM.hf_to_vllm_mapper`` and loader do):

- prefix ``backbone.`` (checkpoints) or ``model.`` (transformers 5) -> ``model.``
- ``embeddings`` -> ``embed_tokens``
- separate ``q_proj`` / ``k_proj`` / ``v_proj`` -> one ``qkv_proj`` (stacked in that order)
- per-expert ``experts.{j}.up_proj.weight`` -> row ``j`` of the stacked ``experts.up_proj``
  (transformers 5's fused ``experts.up_proj`` loads as is); the same for ``down_proj``
- ``A_log`` stays ``A_log`` (the model computes ``A = -exp(A_log)`` itself)
- ``mtp.*`` (multi-token-prediction layers) are skipped, as vLLM skips them

Every missing, unexpected or mis-shaped tensor is collected and reported in one
:class:`WeightLoadError`; nothing is loaded unless everything fits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.radio import RadioVisionModel

if TYPE_CHECKING:  # model.py builds on this module's neighbours; no import cycle at run time
    from reference_impl.model import NanoNemotronVLForConditionalGeneration

_QKV = re.compile(r"^(?P<prefix>.*\.mixer)\.(?P<part>[qkv])_proj\.weight$")
_EXPERT = re.compile(
    r"^(?P<prefix>.*\.mixer\.experts)\.(?P<j>\d+)\.(?P<proj>up_proj|down_proj)\.weight$"
)


class WeightLoadError(ValueError):
    """The state dict does not fit the model; lists every problem at once."""

    def __init__(self, missing: list[str], unexpected: list[str], mis_shaped: list[str]) -> None:
        self.missing, self.unexpected, self.mis_shaped = missing, unexpected, mis_shaped
        parts = []
        for title, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mis-shaped or inconsistent", mis_shaped),
        ):
            if names:
                parts.append(f"{len(names)} {title}: " + ", ".join(names))
        super().__init__("weights do not fit the model: " + "; ".join(parts))


def map_name(name: str) -> str | None:
    """The model's parameter name for a checkpoint name (before q/k/v and expert stacking);
    None for names that are skipped on purpose."""
    if name.startswith(("mtp.", "backbone.mtp.", "model.mtp.")):
        return None
    for prefix in ("backbone.", "model."):
        if name.startswith(prefix):
            name = "model." + name.removeprefix(prefix)
            break
    return name.replace(".embeddings.", ".embed_tokens.")


def convert_state_dict(
    model: NemotronHForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors renamed and stacked into the model's parameter names, checked against
    the model's shapes; :class:`WeightLoadError` lists every problem."""
    expected = {name: p.shape for name, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    unexpected: list[str] = []
    tied_head: torch.Tensor | None = None
    for original, tensor in weights:
        name = map_name(original)
        if name is None:
            continue
        if model.config.tie_word_embeddings and name == "lm_head.weight":
            tied_head = tensor  # tied: the embedding is the head; checked below
            continue
        if (m := _QKV.match(name)) is not None:
            qkv.setdefault(f"{m['prefix']}.qkv_proj.weight", {})[m["part"]] = tensor
        elif (m := _EXPERT.match(name)) is not None:
            experts.setdefault(f"{m['prefix']}.{m['proj']}", {})[int(m["j"])] = tensor
        elif name in expected:
            out[name] = tensor
        else:
            unexpected.append(original)
    missing: list[str] = []
    accounted = set(qkv) | set(experts)  # reported part by part below
    for name, parts in qkv.items():
        if set(parts) == {"q", "k", "v"} and name in expected:
            out[name] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        elif name in expected:
            missing += [name.replace("qkv_proj", f"{p}_proj") for p in "qkv" if p not in parts]
        else:
            unexpected += [name.replace("qkv_proj", f"{p}_proj") for p in parts]
    for name, rows in experts.items():
        if name not in expected:
            unexpected += [
                f"{name.rsplit('.', 1)[0]}.{j}.{name.rsplit('.', 1)[1]}.weight" for j in rows
            ]
            continue
        count = expected[name][0]
        absent = [j for j in range(count) if j not in rows]
        if absent:
            missing += [f"{name} expert {j}" for j in absent]
        else:
            out[name] = torch.stack([rows[j] for j in range(count)])
    missing += sorted(n for n in expected if n not in out and n not in accounted)
    mis_shaped = [
        f"{name} (expected {tuple(expected[name])}, got {tuple(t.shape)})"
        for name, t in out.items()
        if t.shape != expected[name]
    ]
    embed = out.get("model.embed_tokens.weight")
    if tied_head is not None and embed is not None and not torch.equal(tied_head, embed):
        mis_shaped.append(
            "lm_head.weight (tie_word_embeddings is set, but it differs from the embeddings)"
        )
    if missing or unexpected or mis_shaped:
        raise WeightLoadError(sorted(missing), sorted(unexpected), mis_shaped)
    return out


def load_state_dict(
    model: NemotronHForCausalLM,
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> None:
    """Load a Hugging Face state dict (a mapping or ``(name, tensor)`` pairs) into ``model``."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    converted = convert_state_dict(model, items)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in converted.items():
            params[name].copy_(tensor)


def load_safetensors(model: NemotronHForCausalLM, path: str | Path) -> None:
    """Load a ``.safetensors`` file in Hugging Face naming into ``model``."""
    from safetensors.torch import load_file

    load_state_dict(model, load_file(str(path)))


def copy_streamed(tensor: torch.Tensor) -> torch.Tensor:
    """A streamed tensor's own copy: the loader may reuse its buffer for the next tensor."""
    return tensor.detach().clone()


#: Checkpoint prefixes of the towers and the connector (skipped in text-only mode).
TOWER_PREFIXES: tuple[str, ...] = (
    "vision_model.",
    "mlp1.",
    "vision_projector.",
    "sound_encoder.",
    "sound_projection.",
)


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
    projection = {"norm": "0", "linear1": "1", "linear2": "3"}
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
            groups["sound"][f"projection.{projection.get(part, part)}.{rest}"] = tensor
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


#: Parakeet's convolution biases: absent from the encoder when ``convolution_bias = False``, yet
#: carried by released checkpoints of that config (vLLM #40007 skips them when loading).
CONV_BIAS_SUFFIXES = (
    ".conv.pointwise_conv1.bias",
    ".conv.depthwise_conv.bias",
    ".conv.pointwise_conv2.bias",
)


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
    from reference_impl.checkpoint import checkpoint_state_dict

    def normal(name: str) -> str:
        if name.startswith("language_model.model."):
            name = "language_model.backbone." + name.removeprefix("language_model.model.")
        return name.replace(".embed_tokens.", ".embeddings.")

    present = {normal(name) for name in given}
    fused = {name.rsplit(".", 1)[0] for name in present if name.endswith(("up_proj", "down_proj"))}
    missing = []
    for name in checkpoint_state_dict(model):
        if (text_only and name.startswith(TOWER_PREFIXES)) or name in present:
            continue
        expert = _EXPERT.match(name.removeprefix("language_model."))
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
