"""Checkpoint tensors streamed the ways weight loaders stream them.

A loader hands a model ``(name, tensor)`` pairs one at a time. Streaming loaders reuse their
buffers: the tensor of one pair may be overwritten by the next pair's, so a model that keeps a
reference instead of copying holds whatever came last (vLLM PR #42244).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

Weights = Iterable[tuple[str, torch.Tensor]]


def reusing_buffers(weights: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor copied into one buffer per shape and dtype, which the next tensor of the same
    shape and dtype overwrites."""
    buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
    for name, tensor in weights.items():
        key = (tuple(tensor.shape), tensor.dtype)
        if key not in buffers:
            buffers[key] = torch.empty_like(tensor)
        buffers[key].copy_(tensor)
        yield name, buffers[key]


def renamed(weights: Mapping[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    """The checkpoint with the name prefix ``old`` replaced by ``new``."""
    return {(new + k.removeprefix(old) if k.startswith(old) else k): t for k, t in weights.items()}


class RecordedTensor(torch.Tensor):
    """A checkpoint tensor that records its name in :attr:`reads` when any torch operation
    reads it; what the operation returns is a plain tensor."""

    reads: list[str]
    checkpoint_name: str

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        for arg in (*args, *(kwargs or {}).values()):
            reads = getattr(arg, "reads", None)
            if isinstance(arg, RecordedTensor) and reads is not None:
                reads.append(arg.checkpoint_name)
                break
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def recording_reads(
    weights: Weights, prefixes: tuple[str, ...], reads: list[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with every tensor whose name starts with one of ``prefixes`` recording its
    reads into ``reads``."""
    for name, tensor in weights:
        if name.startswith(prefixes):
            recorded = tensor.as_subclass(RecordedTensor)
            recorded.reads = reads
            recorded.checkpoint_name = name
            yield name, recorded
        else:
            yield name, tensor
