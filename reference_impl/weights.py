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

A whole Nano-Nemotron VL checkpoint (towers, connector, and the language model under
``language_model.``) loads through :func:`reference_impl.checkpoint.load_vl_checkpoint`, which
hands the language model's tensors to this loader.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from reference_impl.nemotron_h import NemotronHForCausalLM

_QKV = re.compile(r"^(?P<prefix>.*\.mixer)\.(?P<part>[qkv])_proj\.weight$")
#: One expert's projection, as checkpoints name it (stacked into the model's fused tensor).
EXPERT_WEIGHT = re.compile(
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
        elif (m := EXPERT_WEIGHT.match(name)) is not None:
            experts.setdefault(f"{m['prefix']}.{m['proj']}", {})[int(m["j"])] = tensor
        elif name in expected:
            out[name] = tensor
        else:
            unexpected.append(original)
    missing: list[str] = []
    mis_shaped: list[str] = []
    accounted = set(qkv) | set(experts)  # reported part by part below
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    for name, parts in qkv.items():
        if set(parts) == {"q", "k", "v"} and name in expected:
            # Each part by its own name: a part of another shape is the checkpoint's tensor.
            head_rows = expected[name][0] // (heads + 2 * kv_heads)
            part_rows = {
                "q": heads * head_rows,
                "k": kv_heads * head_rows,
                "v": kv_heads * head_rows,
            }
            shapes = {part: (part_rows[part], expected[name][1]) for part in "qkv"}
            wrong = [
                f"{name.replace('qkv_proj', f'{part}_proj')} (expected {shapes[part]}, got "
                f"{tuple(parts[part].shape)})"
                for part in "qkv"
                if tuple(parts[part].shape) != shapes[part]
            ]
            if wrong:
                mis_shaped += wrong
                continue
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
    mis_shaped += [
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
