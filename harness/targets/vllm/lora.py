"""vLLM's own LoRA machinery on the model built from a checkpoint folder, as its engine serves it.

The model runner's steps (``LoRAModelRunnerMixin``), on the CPU:

1. ``LRUCacheWorkerLoRAManager(vllm_config, device, model.embedding_modules)`` and its
   ``create_lora_manager``: vLLM's LoRA layers replace the modules it supports (the punica
   wrapper on the CPU platform is ``PunicaWrapperCPU``, plain torch);
2. an adapter is loaded from its PEFT folder by ``add_adapter(LoRARequest)`` (vLLM's
   ``PEFTHelper`` and ``LoRAModel.from_local_checkpoint``) and activated into a slot;
3. each batch: ``set_active_adapters(requests, LoRAMapping(token ids, prompt ids,
   is_prefill=True))``, then the model's layers run.

What an adapter was applied to is read from vLLM's LoRA layers themselves: the slices of each
layer's ``lora_b_stacked`` that hold non-zero weights in the adapter's slot.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.inputs.requests import Request, RequestResult
from harness.targets.base import AdapterLoad, LoRAServing
from harness.targets.vllm.requests import VllmRequestPath

#: vLLM's language-model prefix and the checkpoint's.
VLLM_LM, CHECKPOINT_LM = "language_model.model.", "language_model.backbone."


def checkpoint_module(name: str) -> str:
    """The checkpoint's name of vLLM module ``name`` (packed parts named by the caller)."""
    if name.startswith(VLLM_LM):
        name = CHECKPOINT_LM + name.removeprefix(VLLM_LM)
    return name.replace(".embed_tokens", ".embeddings")


class _Told(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def told() -> Iterator[list[str]]:
    """What vLLM says meanwhile: its log records at WARNING or above, and Python warnings."""
    handler = _Told()
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield handler.messages
    finally:
        logger.removeHandler(handler)
    handler.messages += [str(w.message) for w in caught]


class VllmLoRAServing(LoRAServing):
    """vLLM's LoRA manager on a model built with the engine's ``LoRAConfig``."""

    def __init__(self, model: Any, vllm_config: Any) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

        self.vllm_config = vllm_config
        with set_current_vllm_config(vllm_config):
            self.worker = LRUCacheWorkerLoRAManager(
                vllm_config, torch.device("cpu"), model.embedding_modules
            )
            self.model = self.worker.create_lora_manager(model, vllm_config)
        self.manager = self.worker._adapter_manager
        self.requests: dict[int, Any] = {}
        self.request_path = VllmRequestPath(self.model, vllm_config)

    # Adapters ------------------------------------------------------------------------------

    def add(self, adapter_id: int, folder: Path) -> AdapterLoad:
        from vllm.config import set_current_vllm_config
        from vllm.lora.request import LoRARequest

        request = LoRARequest(folder.name, adapter_id, str(folder))
        with told() as messages, set_current_vllm_config(self.vllm_config):
            self.worker.add_adapter(request)
            self.requests[adapter_id] = request
            self._activate([adapter_id])
        return AdapterLoad(self.applied(adapter_id), list(messages))

    def remove(self, adapter_id: int) -> None:
        self.worker.remove_adapter(adapter_id)
        self.requests.pop(adapter_id, None)

    def adapters(self) -> list[int]:
        return sorted(self.worker.list_adapters())

    def applied(self, adapter_id: int) -> list[str]:
        """Checkpoint names of the modules whose slot for ``adapter_id`` holds weights."""
        if adapter_id not in self.manager.lora_index_to_id:
            raise ValueError(
                f"applied: adapter_id: expected an active adapter "
                f"{[a for a in self.manager.lora_index_to_id if a is not None]}, got {adapter_id}"
            )
        slot = self.manager.lora_index_to_id.index(adapter_id)
        packed = self.manager.packed_modules_mapping
        names: list[str] = []
        for name, layer in self.manager.modules.items():
            stacked = getattr(layer, "lora_b_stacked", None)
            if stacked is None:
                continue
            slices = stacked if isinstance(stacked, tuple | list) else (stacked,)
            parent, _, leaf = name.rpartition(".")
            # A packed layer's slices are its parts (qkv_proj: q, k, v); any other layer's
            # slices (Mamba's in_proj and conv1d, cut by output) are one checkpoint module.
            parts = packed.get(leaf, [leaf] * len(slices))
            for part, weights in zip(parts, slices, strict=True):
                if bool(weights[slot].abs().sum() > 0):
                    names.append(checkpoint_module(f"{parent}.{part}"))
        return sorted(set(names))

    # Running -------------------------------------------------------------------------------

    def _activate(self, adapters: Sequence[int]) -> None:
        """The batch's mapping, as the model runner sets it: one entry per token."""
        from vllm.lora.layers import LoRAMapping

        ids = tuple(int(a) for a in adapters)
        requests = {self.requests[a] for a in ids if a}
        self.worker.set_active_adapters(requests, LoRAMapping(ids, ids, is_prefill=True))

    def linear(self, module: str, x: torch.Tensor, adapters: Sequence[int]) -> torch.Tensor:
        from vllm.config import set_current_vllm_config

        layer_name, part = self._vllm_layer(module)
        layer = self.manager.modules[layer_name]
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            self._activate(adapters)
            result = layer(x.to(layer.base_layer.weight.dtype))
        out: torch.Tensor = result[0] if isinstance(result, tuple) else result
        if part is None:
            return out
        sizes = list(layer.base_layer.output_sizes)
        parts = self.manager.packed_modules_mapping[layer_name.rpartition(".")[2]]
        start = sum(sizes[: parts.index(part)])
        return out[:, start : start + sizes[parts.index(part)]]

    def _vllm_layer(self, module: str) -> tuple[str, str | None]:
        """vLLM's LoRA layer of checkpoint module ``module``, and the packed part it is."""
        name = module
        if name.startswith(CHECKPOINT_LM):
            name = VLLM_LM + name.removeprefix(CHECKPOINT_LM)
        name = name.replace(".embeddings", ".embed_tokens")
        if name in self.manager.modules:
            return name, None
        parent, _, leaf = name.rpartition(".")
        for packed, parts in self.manager.packed_modules_mapping.items():
            if leaf in parts and f"{parent}.{packed}" in self.manager.modules:
                return f"{parent}.{packed}", leaf
        raise KeyError(f"{module}: no LoRA layer of vLLM's model holds it")

    def embed(self, ids: Sequence[int], adapters: Sequence[int]) -> torch.Tensor:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            self._activate(adapters)
            out: torch.Tensor = self.model.embed_input_ids(torch.tensor(list(ids)))
        return out

    def embed_multimodal(
        self, adapters: Sequence[int], **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            self._activate(adapters)
            return tuple(self.model.embed_multimodal(**kwargs))

    def run_request(self, request: Request, adapters: Sequence[int]) -> RequestResult:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            self._activate(adapters)
        return self.request_path.run(request)
