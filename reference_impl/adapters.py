"""LoRA adapters as PEFT saves them, read into :class:`~reference_impl.lora.LoRAAdapter`.

A PEFT folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``use_rslora``, ...) and
``adapter_model.safetensors``, whose keys are ``base_model.model.<module>.lora_A.weight``
``[r, i]`` and ``...lora_B.weight`` ``[o, r]`` per linear layer, ``...lora_embedding_A``
``[r, vocab]`` and ``...lora_embedding_B`` ``[h, r]`` for an embedding; ``<module>`` is the
checkpoint's module name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from reference_impl.lora import LoRAAdapter, LoRAError
from reference_impl.weights import map_name

#: PEFT's prefix of every key of a saved adapter.
PEFT_PREFIX = "base_model.model."


def read_peft_adapter(folder: Path, name: str) -> LoRAAdapter:
    """The adapter PEFT saved in ``folder`` (``adapter_config.json``: ``r``, ``lora_alpha``,
    ``use_rslora``; ``adapter_model.safetensors``: ``<module>.lora_A.weight [r, i]``,
    ``<module>.lora_B.weight [o, r]``, an embedding's ``<module>.lora_embedding_A [r, vocab]``
    and ``lora_embedding_B [h, r]``, each key under ``base_model.model.``), its modules named
    as :class:`~reference_impl.lora.LoRAModel` names them: the language model's
    (``language_model.backbone.*`` or ``language_model.model.*``) relative to it
    (``model.layers.2.mixer.q_proj``, ``model.embed_tokens``, ``lm_head``), any other module by
    its full name (which :meth:`~reference_impl.lora.LoRAModel.load` refuses, naming it)."""
    from safetensors.torch import load_file

    config_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise LoRAError(f"{name}: {path.name}: expected a PEFT adapter file, found none")
    for extra in ("added_tokens.json", "new_embeddings.safetensors"):
        if (folder / extra).exists():
            raise LoRAError(
                f"{name}: {extra}: expected an adapter over the model's vocabulary, got one "
                "that adds tokens (not supported)"
            )
    config = json.loads(config_path.read_text())
    for key in ("r", "lora_alpha"):
        if key not in config:
            raise LoRAError(f"{name}: {config_path}: field {key!r} is missing")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    suffixes = {
        ".lora_A.weight": "A",
        ".lora_B.weight": "B",
        ".lora_embedding_A": "A",
        ".lora_embedding_B": "B",
    }
    try:
        tensors = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own error type for a corrupt file
        raise LoRAError(
            f"{name}: {weights_path.name}: expected a safetensors file, got unreadable bytes ({e})"
        ) from e
    for key, tensor in tensors.items():
        suffix = next((s for s in suffixes if key.endswith(s)), None)
        if suffix is None or not key.startswith(PEFT_PREFIX):
            raise LoRAError(f"{name}: {weights_path}: {key!r} is not a PEFT LoRA key")
        module = key.removeprefix(PEFT_PREFIX).removesuffix(suffix)
        parts.setdefault(module, {})[suffixes[suffix]] = tensor.float()
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, factors in parts.items():
        if set(factors) != {"A", "B"}:
            raise LoRAError(f"{name}: {weights_path}: {module} has {sorted(factors)}, not A and B")
        weights[_language_model_name(module)] = (factors["A"], factors["B"])
    return LoRAAdapter(
        name,
        int(config["r"]),
        float(config["lora_alpha"]),
        weights,
        use_rslora=bool(config.get("use_rslora", False)),
    )


def _language_model_name(module: str) -> str:
    """A checkpoint module name as :class:`~reference_impl.lora.LoRAModel` names the language
    model's modules."""
    if module == "language_model.lm_head":
        return "lm_head"
    if module.startswith("language_model."):
        mapped = map_name(module.removeprefix("language_model.") + ".weight")
        if mapped is not None:
            return mapped.removesuffix(".weight")
    return module
