"""LoRA for the language model only, the way vLLM serves it.

Glossary: ``T`` tokens in the batch, ``N`` the mapping length (``max_num_batched_tokens``),
``S`` adapter slots, ``r`` rank, ``i`` / ``o`` a layer's input / output width.

Several adapters serve one batch: each *token* carries the slot of its request's adapter
(``-1`` for none) in a fixed-length index mapping of ``N`` entries, built by the scheduler from
the request tokens. A wrapped layer adds ``scale * B[slot] @ A[slot] @ x`` to each token's base
output. Tokens the model makes up itself (a video's frame separators, ``<img>``, ``</img>``)
are not request tokens: they have no mapping entry and may outnumber ``N``, so they are embedded
with the *base* embedding layer (vLLM PR #56231). The vision tower, the connector and the audio
tower get no LoRA.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from reference_impl.nemotron_h import NemotronHForCausalLM

#: The LM's LoRA metadata; the VL wrapper must carry the same values (vLLM PR #56231 copies them).
PACKED_MODULES_MAPPING = NemotronHForCausalLM.packed_modules_mapping
LORA_SKIP_PREFIXES = NemotronHForCausalLM.lora_skip_prefixes
#: Module prefixes of the VL model LoRA never touches.
TOWER_PREFIXES = (
    "vision_model",
    "mlp1",
    "vision_final_layernorm",
    "sound_encoder",
    "sound_projection",
    "multimodal.",
)


class LoRAError(ValueError):
    """An adapter does not fit the model; the message names the module."""


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter: ``(A [r, i], B [o, r])`` per target module, in checkpoint naming relative to
    the language model (``model.layers.1.mixer.q_proj``, ``model.embed_tokens`` with
    ``A [r, vocab]``)."""

    name: str
    rank: int
    alpha: float
    weights: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    use_rslora: bool = False  # rank-stabilised LoRA: the delta scaled by alpha / sqrt(r)

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @property
    def trains_embeddings(self) -> bool:
        return any(name.endswith("embed_tokens") for name in self.weights)


@dataclass
class LoRAContext:
    """The batch's per-token adapter slots, a fixed-length buffer shared by every wrapper."""

    max_num_batched_tokens: int
    mapping: torch.Tensor = field(init=False)
    num_tokens: int = 0

    def __post_init__(self) -> None:
        self.mapping = torch.full((self.max_num_batched_tokens,), -1, dtype=torch.int64)

    def set(self, slots: Sequence[int]) -> None:
        if len(slots) > self.max_num_batched_tokens:
            raise LoRAError(
                f"token mapping: at most max_num_batched_tokens="
                f"{self.max_num_batched_tokens} tokens, got {len(slots)}"
            )
        self.mapping.fill_(-1)
        self.mapping[: len(slots)] = torch.tensor(list(slots), dtype=torch.int64)
        self.num_tokens = len(slots)

    def slots_for(self, count: int) -> torch.Tensor:
        """The first ``count`` entries; more tokens than the mapping holds is the upstream
        failure (tokens without an entry), raised clearly."""
        if count > self.max_num_batched_tokens:
            raise LoRAError(
                f"token mapping: {count} tokens but the mapping holds "
                f"{self.max_num_batched_tokens} (max_num_batched_tokens)"
            )
        return self.mapping[:count]


class LoRALinear(nn.Module):
    """A linear layer with ``S`` adapter slots; packed layers (qkv) take one ``(A, B)`` per
    slice, stacked along the output."""

    lora_a: torch.Tensor  # [S, r, i]
    lora_b: torch.Tensor  # [S, o, r]

    def __init__(
        self, base_layer: nn.Linear, context: LoRAContext, slots: int, max_rank: int
    ) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.context = context
        i, o = base_layer.in_features, base_layer.out_features
        self.register_buffer("lora_a", torch.zeros(slots, max_rank, i))
        self.register_buffer("lora_b", torch.zeros(slots, o, max_rank))
        self.scaling = [0.0] * slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base_layer(x)
        flat = x.reshape(-1, x.shape[-1])
        slots = self.context.slots_for(flat.shape[0]).to(x.device)
        delta = torch.zeros(flat.shape[0], out.shape[-1], dtype=torch.float32, device=x.device)
        for slot in torch.unique(slots[slots >= 0]).tolist():
            rows = slots == slot
            a, b = self.lora_a[slot].float(), self.lora_b[slot].float()
            delta[rows] = (flat[rows].float() @ a.t() @ b.t()) * self.scaling[slot]
        return out + delta.reshape(out.shape).to(out.dtype)


class LoRAEmbedding(nn.Module):
    """An embedding with ``S`` adapter slots: ``+ scale * B[slot] @ A[slot][:, token]``."""

    lora_a: torch.Tensor  # [S, r, vocab]
    lora_b: torch.Tensor  # [S, h, r]

    def __init__(
        self, base_layer: nn.Embedding, context: LoRAContext, slots: int, max_rank: int
    ) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.context = context
        self.register_buffer("lora_a", torch.zeros(slots, max_rank, base_layer.num_embeddings))
        self.register_buffer("lora_b", torch.zeros(slots, base_layer.embedding_dim, max_rank))
        self.scaling = [0.0] * slots

    @property
    def embedding_dim(self) -> int:
        return self.base_layer.embedding_dim

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base_layer(ids)
        flat = ids.reshape(-1)
        slots = self.context.slots_for(flat.shape[0]).to(ids.device)
        delta = torch.zeros(flat.shape[0], out.shape[-1], dtype=torch.float32, device=ids.device)
        for slot in torch.unique(slots[slots >= 0]).tolist():
            rows = slots == slot
            a = self.lora_a[slot][:, flat[rows]].float()  # [r, t]
            delta[rows] = (self.lora_b[slot].float() @ a).t() * self.scaling[slot]
        return out + delta.reshape(out.shape).to(out.dtype)


@dataclass
class LoRAModel:
    """A language model with its LoRA wrappers and the adapters loaded into slots."""

    model: NemotronHForCausalLM
    context: LoRAContext
    wrappers: dict[str, LoRALinear | LoRAEmbedding]
    adapters: dict[str, int] = field(default_factory=dict)  # name -> slot
    loaded: dict[str, LoRAAdapter] = field(default_factory=dict)

    def prepare(self, requests: Sequence[tuple[str | None, int, bool]]) -> None:
        """Set the batch's token mapping from ``(adapter name or None, prompt tokens, has a
        video)`` per request, in batch order. Beyond upstream: an adapter that trains
        ``embed_tokens`` serving a video request warns (once per batch and adapter) that the
        video's marker tokens get no embedding delta."""
        slots: list[int] = []
        warned: set[str] = set()
        for name, count, has_video in requests:
            if name is not None and name not in self.adapters:
                raise LoRAError(
                    f"request adapter: {name!r} is not loaded (loaded: {sorted(self.adapters)})"
                )
            slots += [self.adapters[name] if name is not None else -1] * count
            adapter = self.loaded.get(name) if name is not None else None
            if adapter is not None and has_video and name not in warned:
                warn_video_tokens_without_delta(adapter)
                warned.add(adapter.name)
        self.context.set(slots)

    def load(self, adapter: LoRAAdapter) -> int:
        """Put ``adapter`` in the first free slot; every module name must be a wrapped layer
        (or a slice of a packed one). All of it is checked before the slot is touched, and the
        slot is cleared first: a refused adapter leaves nothing, a loaded one nothing of an
        earlier one."""
        capacity = next(iter(self.wrappers.values())).lora_a.shape[0]
        taken = set(self.adapters.values())
        slot = next((s for s in range(capacity) if s not in taken), capacity)
        if slot >= capacity:
            raise LoRAError(
                f"{adapter.name}: max_loras: expected a free slot of {capacity}, got all taken"
            )
        writes = self.check(adapter)
        self._clear(slot)
        with torch.no_grad():
            for wrapper, a, b in writes:
                r = a.shape[0]
                wrapper.lora_a[slot, :r] = a
                wrapper.lora_b[slot, :, :r] = b
                wrapper.scaling[slot] = adapter.scaling
        self.adapters[adapter.name] = slot
        self.loaded[adapter.name] = adapter
        return slot

    def check(
        self, adapter: LoRAAdapter
    ) -> list[tuple[LoRALinear | LoRAEmbedding, torch.Tensor, torch.Tensor]]:
        """What loading ``adapter`` writes, ``(wrapper, A, B)`` per wrapped layer (a packed
        layer's parts stacked), every name, rank and shape checked; nothing written."""
        max_rank = next(iter(self.wrappers.values())).lora_a.shape[1]
        if adapter.rank > max_rank:
            raise LoRAError(
                f"{adapter.name}: r: expected a rank of at most max_lora_rank={max_rank}, got "
                f"{adapter.rank}"
            )
        writes = []
        packed: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        for name, (a, b) in adapter.weights.items():
            if name.startswith(TOWER_PREFIXES) or ".vision_model." in name:
                raise LoRAError(
                    f"{adapter.name}: target module {name}: expected a module of the language "
                    "model (LoRA covers the language model only, not the vision tower, the "
                    "connector or the audio tower), got a module of a tower"
                )
            parent, _, leaf = name.rpartition(".")
            owner = next((p for p, parts in PACKED_MODULES_MAPPING.items() if leaf in parts), None)
            if owner is not None:
                packed.setdefault(f"{parent}.{owner}", {})[leaf] = (a, b)
                continue
            writes.append(self._checked(adapter, name, a, b))
        for name, parts in packed.items():
            wrapper = self._wrapper(adapter, name)
            assert isinstance(wrapper, LoRALinear)
            pieces = PACKED_MODULES_MAPPING[name.rpartition(".")[2]]
            base = wrapper.base_layer
            sizes = _qkv_sizes(self.model)
            a_stack, b_rows = [], []
            for piece, size in zip(pieces, sizes, strict=True):
                if piece in parts:
                    a, b = parts[piece]
                    a_stack.append(a)
                    b_rows.append(b)
                else:
                    a_stack.append(torch.zeros(adapter.rank, base.in_features))
                    b_rows.append(torch.zeros(size, adapter.rank))
            # A packed delta is block-diagonal in rank: each slice keeps its own A.
            a_full = torch.cat(a_stack)  # [3r, i]
            b_full = _block_diagonal(b_rows)  # [o, 3r]
            writes.append(self._checked(adapter, name, a_full, b_full))
        return writes

    def _clear(self, slot: int) -> None:
        with torch.no_grad():
            for wrapper in self.wrappers.values():
                wrapper.lora_a[slot].zero_()
                wrapper.lora_b[slot].zero_()
                wrapper.scaling[slot] = 0.0

    def unload(self, name: str) -> None:
        """Free ``name``'s slot (its weights zeroed)."""
        if name not in self.adapters:
            raise LoRAError(
                f"unload: expected a loaded adapter ({sorted(self.adapters)}), got {name!r}"
            )
        self._clear(self.adapters.pop(name))
        self.loaded.pop(name)

    def _wrapper(self, adapter: LoRAAdapter, name: str) -> LoRALinear | LoRAEmbedding:
        if name not in self.wrappers:
            raise LoRAError(
                f"{adapter.name}: target module {name}: expected a LoRA target of this model "
                f"({', '.join(sorted(self.wrappers)[:6])}, ...), got a module it lacks"
            )
        return self.wrappers[name]

    def _checked(
        self, adapter: LoRAAdapter, name: str, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[LoRALinear | LoRAEmbedding, torch.Tensor, torch.Tensor]:
        wrapper = self._wrapper(adapter, name)
        r = a.shape[0]
        if r > wrapper.lora_a.shape[1]:
            raise LoRAError(
                f"{adapter.name}: {name}: expected a rank of at most {wrapper.lora_a.shape[1]}, "
                f"got {r}"
            )
        want_a = (r, wrapper.lora_a.shape[2])
        want_b = (wrapper.lora_b.shape[1], r)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise LoRAError(
                f"{adapter.name}: {name}: expected A {want_a} and B {want_b}, got "
                f"A {tuple(a.shape)} and B {tuple(b.shape)}"
            )
        return wrapper, a, b


def _block_diagonal(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks))
    row = col = 0
    for block in blocks:
        out[row : row + block.shape[0], col : col + block.shape[1]] = block
        row, col = row + block.shape[0], col + block.shape[1]
    return out


def _qkv_sizes(model: NemotronHForCausalLM) -> list[int]:
    c = model.config
    q = c.num_attention_heads * c.attention_head_dim
    kv = c.num_key_value_heads * c.attention_head_dim
    return [q, kv, kv]


def apply_lora(
    model: NemotronHForCausalLM, *, max_loras: int, max_rank: int, max_num_batched_tokens: int
) -> LoRAModel:
    """Wrap every linear layer and the embedding of the language model in place (MTP layers
    skipped, as vLLM's ``lora_skip_prefixes``). The packed rank of qkv is three slices."""
    context = LoRAContext(max_num_batched_tokens)
    wrappers: dict[str, LoRALinear | LoRAEmbedding] = {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if full.startswith(tuple(LORA_SKIP_PREFIXES)):
                continue
            wrapped: LoRALinear | LoRAEmbedding
            if isinstance(child, nn.Linear):
                rank = 3 * max_rank if child_name == "qkv_proj" else max_rank
                wrapped = LoRALinear(child, context, max_loras, rank)
            elif isinstance(child, nn.Embedding):
                wrapped = LoRAEmbedding(child, context, max_loras, max_rank)
            else:
                continue
            setattr(module, child_name, wrapped)
            wrappers[full] = wrapped
    return LoRAModel(model, context, wrappers)


def merged_copy(lora: LoRAModel, adapter: LoRAAdapter) -> NemotronHForCausalLM:
    """A plain model with ``adapter`` merged into its weights (``W + scale * B @ A``): the
    numerical oracle for the LoRA forward."""
    import copy

    plain = copy.deepcopy(lora.model)
    slot = lora.adapters[adapter.name]
    for name, wrapper in list(_wrappers_of(plain).items()):
        parent_name, _, child = name.rpartition(".")
        parent = plain.get_submodule(parent_name) if parent_name else plain
        base = wrapper.base_layer
        with torch.no_grad():
            delta = wrapper.lora_b[slot] @ wrapper.lora_a[slot] * wrapper.scaling[slot]
            if isinstance(base, nn.Embedding):
                base.weight += delta.t()
            else:
                base.weight += delta
        setattr(parent, child, base)
    return plain


def _wrappers_of(model: nn.Module) -> dict[str, LoRALinear | LoRAEmbedding]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear | LoRAEmbedding)}


def base_embedding(embed: nn.Module) -> nn.Module:
    """The layer to embed encoder-internal tokens with: the base layer under a LoRA wrapper."""
    return embed.base_layer if isinstance(embed, LoRAEmbedding) else embed


def warn_video_tokens_without_delta(adapter: LoRAAdapter) -> None:
    """Beyond upstream: an adapter that trains ``embed_tokens`` gives the video's marker tokens
    (frame separators, ``<img>``, ``</img>``) no embedding delta; say so once."""
    if adapter.trains_embeddings:
        warnings.warn(
            f"LoRA adapter {adapter.name!r} trains embed_tokens, but a video's frame separators "
            "and <img> / </img> tokens are embedded with the base layer: they do not receive "
            "its embedding delta",
            stacklevel=2,
        )
