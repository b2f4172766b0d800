"""The reference model of a checkpoint folder served with its LM-only LoRA
(:mod:`reference_impl.lora`): adapters read from PEFT folders, a per-token slot mapping."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from harness.inputs.requests import Request, RequestResult
from harness.targets.base import AdapterLoad, LoRAOptions, LoRAServing
from harness.targets.reference import requests
from reference_impl.adapters import read_peft_adapter
from reference_impl.lora import (
    PACKED_MODULES_MAPPING,
    LoRAEmbedding,
    LoRALinear,
    apply_lora,
)
from reference_impl.model import NanoNemotronVLForConditionalGeneration

CHECKPOINT_LM = "language_model.backbone."


def checkpoint_module(name: str) -> str:
    """The checkpoint's name of the reference LM's module ``name``."""
    if name == "lm_head":
        return "language_model.lm_head"
    name = name.replace(".embed_tokens", ".embeddings")
    return CHECKPOINT_LM + name.removeprefix("model.")


class ReferenceLoRAServing(LoRAServing):
    def __init__(
        self,
        model: NanoNemotronVLForConditionalGeneration,
        options: LoRAOptions,
        max_num_batched_tokens: int = 8192,
    ) -> None:
        self.model = model
        self.lora = apply_lora(
            model.language_model,
            max_loras=options.max_loras,
            max_rank=options.max_lora_rank,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        # The wrapper model reads the LM's embedding layer through its own attribute.
        model.multimodal.embed_tokens = model.language_model.model.embed_tokens
        self.options = options
        self.names: dict[int, str] = {}
        self.used: list[int] = []  # adapter ids, least recently used first

    def add(self, adapter_id: int, folder: Path) -> AdapterLoad:
        name = f"{adapter_id}:{folder}"
        adapter = read_peft_adapter(folder, name)
        self.lora.check(adapter)  # refused before any adapter is evicted for it
        if len(self.names) >= self.options.max_loras:
            # As the engine's LRU cache: the least recently used adapter makes room.
            self.remove(self.used[0])
        self.lora.load(adapter)
        self.names[adapter_id] = name
        self._touch(adapter_id)
        return AdapterLoad(self.applied(adapter_id), [])

    def remove(self, adapter_id: int) -> None:
        if adapter_id not in self.names:
            raise ValueError(
                f"remove: adapter_id: expected a loaded adapter {sorted(self.names)}, got "
                f"{adapter_id}"
            )
        self.lora.unload(self.names.pop(adapter_id))
        self.used.remove(adapter_id)

    def _touch(self, adapter_id: int) -> None:
        if adapter_id in self.used:
            self.used.remove(adapter_id)
        self.used.append(adapter_id)

    def adapters(self) -> list[int]:
        return sorted(self.names)

    def applied(self, adapter_id: int) -> list[str]:
        slot = self.lora.adapters[self.names[adapter_id]]
        names: list[str] = []
        for name, wrapper in self.lora.wrappers.items():
            b = wrapper.lora_b[slot]
            leaf = name.rpartition(".")[2]
            if leaf in PACKED_MODULES_MAPPING:
                start = 0
                for part, size in zip(
                    PACKED_MODULES_MAPPING[leaf], self._part_sizes(), strict=True
                ):
                    if bool(b[start : start + size].abs().sum() > 0):
                        names.append(checkpoint_module(f"{name.rpartition('.')[0]}.{part}"))
                    start += size
            elif bool(b.abs().sum() > 0):
                names.append(checkpoint_module(name))
        return sorted(names)

    def _part_sizes(self) -> list[int]:
        c = self.model.language_model.config
        q = c.num_attention_heads * c.attention_head_dim
        kv = c.num_key_value_heads * c.attention_head_dim
        return [q, kv, kv]

    def _set(self, adapters: Sequence[int]) -> None:
        for adapter_id in dict.fromkeys(a for a in adapters if a):
            self._touch(adapter_id)
        self.lora.context.set([self.lora.adapters[self.names[a]] if a else -1 for a in adapters])

    def linear(self, module: str, x: torch.Tensor, adapters: Sequence[int]) -> torch.Tensor:
        name, part = self._reference_layer(module)
        wrapper = self.lora.wrappers[name]
        assert isinstance(wrapper, LoRALinear)
        self._set(adapters)
        with torch.no_grad():
            out: torch.Tensor = wrapper(x.float())
        if part is None:
            return out
        parts = PACKED_MODULES_MAPPING[name.rpartition(".")[2]]
        sizes = self._part_sizes()
        start = sum(sizes[: parts.index(part)])
        return out[:, start : start + sizes[parts.index(part)]]

    def _reference_layer(self, module: str) -> tuple[str, str | None]:
        if module == "language_model.lm_head":
            return "lm_head", None
        name = "model." + module.removeprefix(CHECKPOINT_LM).replace(".embeddings", ".embed_tokens")
        if name in self.lora.wrappers:
            return name, None
        parent, _, leaf = name.rpartition(".")
        for packed, parts in PACKED_MODULES_MAPPING.items():
            if leaf in parts and f"{parent}.{packed}" in self.lora.wrappers:
                return f"{parent}.{packed}", leaf
        raise KeyError(f"{module}: no LoRA layer of the reference holds it")

    def embed(self, ids: Sequence[int], adapters: Sequence[int]) -> torch.Tensor:
        embedding = self.lora.wrappers["model.embed_tokens"]
        assert isinstance(embedding, LoRAEmbedding)
        self._set(adapters)
        with torch.no_grad():
            out: torch.Tensor = self.model.language_model.embed_input_ids(torch.tensor(list(ids)))
        return out

    def embed_multimodal(
        self, adapters: Sequence[int], **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        self._set(adapters)
        with torch.no_grad():
            return self.model.multimodal.embed_multimodal(placeholder_counts=None, **kwargs)

    def run_request(self, request: Request, adapters: Sequence[int]) -> RequestResult:
        self._set(adapters)
        return requests.run(self.model.multimodal, request)
