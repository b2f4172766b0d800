"""NemotronH: the hybrid Mamba2 / attention / MLP / MoE language model.

Glossary (sizes from :class:`~reference_impl.config.NemotronHConfig`):

    b   batch                       l   sequence length (prompt, or 1 when decoding)
    H   hidden_size                 V   vocab_size
    a   attention heads             k   key/value heads (GQA: a/k query heads share one)
    d   attention head_dim          S   KV-cache capacity (tokens)
    h   Mamba heads                 p   Mamba head_dim          I   h*p Mamba channels
    g   Mamba groups (B, C shared)  n   SSM state size          K   conv kernel
    E   routed experts              F   expert width            R   routed width (H, or latent)

Every layer is pre-norm with a residual, ``x = x + mixer(norm(x))``, the mixer chosen by the
pattern letter (``M`` Mamba2, ``*`` attention, ``-`` MLP, ``E`` MoE; :data:`MIXERS`); then
``norm_f`` and the head. There is no positional encoding: Mamba layers carry order, attention
is causal.

Mirrors vLLM's ``vllm/model_executor/models/nemotron_h.py`` and ``MambaMixer2``; parameter names
follow vLLM (``model.layers.{i}.mixer.*``, a fused ``qkv_proj``), checkpoint names are mapped in
:mod:`reference_impl.weights`.

Batches of prompts of different lengths are right-padded and carry ``lengths``: padded steps get
``dt = 0`` in the scan (no decay, no input) so Mamba states stay exact, attention is causal so
real tokens never see padding, and decode writes each sequence's next key at its own position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from reference_impl.config import NemotronHConfig
from reference_impl.layers import GatedRMSNorm, RMSNorm, causal_conv1d, relu2
from reference_impl.ssd import ssd_chunked, ssd_sequential

# ---------------------------------------------------------------------------------------------
# Caches


@dataclass
class MambaCache:
    """One Mamba layer's state per sequence: the conv window and the SSM state."""

    conv: torch.Tensor  # [b, I + 2gn, K-1]: the last K-1 conv inputs
    ssm: torch.Tensor  # [b, h, p, n], fp32


@dataclass
class KVCache:
    """One attention layer's keys and values, written at each sequence's own positions."""

    k: torch.Tensor  # [b, k, S, d]
    v: torch.Tensor  # [b, k, S, d]


LayerCache = MambaCache | KVCache


@dataclass
class InferenceCache:
    """Per-layer caches (None for MLP and MoE layers) and the tokens each sequence has seen."""

    layers: list[LayerCache | None]
    lengths: torch.Tensor  # [b], int64
    capacity: int

    @property
    def is_empty(self) -> bool:
        return bool((self.lengths == 0).all())


def _valid_steps(
    lengths: torch.Tensor | None, b: int, l: int, device: torch.device
) -> torch.Tensor:
    """``[b, l]`` bool: step ``t`` of sequence ``i`` is a real token (``t < lengths[i]``)."""
    if lengths is None:
        return torch.ones(b, l, dtype=torch.bool, device=device)
    return torch.arange(l, device=device)[None, :] < lengths[:, None]


# ---------------------------------------------------------------------------------------------
# Mixers

CacheT = TypeVar("CacheT", MambaCache, KVCache, None)


class Mixer(nn.Module, Generic[CacheT]):
    """A layer's token mixer as the layer loop sees it: ``[b, l, H]`` to ``[b, l, H]``.

    ``forward(hidden, cache, lengths, positions)`` runs one of two steps:

    - prefill (``positions is None``): ``lengths [b]`` real tokens per right-padded sequence
      (None: all ``l``); fills ``cache`` when given.
    - decode (``positions [b]``, ``l == 1``): each sequence's new token, at position
      ``positions[i]`` (the tokens it has seen); updates ``cache`` in place.

    Mixers without state (MLP, MoE) make no cache and ignore all but ``hidden``.
    """

    @classmethod
    def from_config(cls, config: NemotronHConfig, layer: int) -> Self:
        """The mixer of layer ``layer``: Mamba2Mixer, Attention and MoE take only the config;
        MLP overrides this (its width may differ per layer)."""
        return cls(config)

    def new_cache(
        self, batch: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> CacheT | None:
        """An empty cache for ``batch`` sequences of up to ``capacity`` tokens, or None."""
        return None

    def forward(
        self,
        hidden: torch.Tensor,
        cache: CacheT | None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


class Mamba2Mixer(Mixer[MambaCache]):
    """``in_proj -> (z, xBC, dt)``; causal depthwise conv + SiLU on ``xBC``; the SSD scan with
    ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)`` and the ``D`` skip; gated RMSNorm in
    groups; ``out_proj``. (vLLM ``MambaMixer2``.)"""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.num_heads, self.head_dim = c.mamba_num_heads, c.mamba_head_dim
        self.groups, self.state_size = c.n_groups, c.ssm_state_size
        self.inner = c.mamba_intermediate_size
        self.conv_dim = c.mamba_conv_dim
        self.in_proj = nn.Linear(
            c.hidden_size, self.inner + self.conv_dim + self.num_heads, bias=c.use_bias
        )
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, c.conv_kernel, groups=self.conv_dim, bias=c.use_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.num_heads + 1).float()))
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.norm = GatedRMSNorm(self.inner, self.inner // self.groups, c.layer_norm_epsilon)
        self.out_proj = nn.Linear(self.inner, c.hidden_size, bias=c.use_bias)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, xbc, dt = torch.split(self.in_proj(x), [self.inner, self.conv_dim, self.num_heads], -1)
        return z, xbc, dt

    def _ssm_inputs(
        self, xbc: torch.Tensor, dt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``xBC [b, l, I+2gn]`` (after the conv) and raw ``dt [b, l, h]`` to the scan's x, dt,
        A, B, C."""
        b, l, _ = xbc.shape
        gn = self.groups * self.state_size
        x, B, C = torch.split(xbc, [self.inner, gn, gn], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        A = -torch.exp(self.A_log.float())
        return (
            x.reshape(b, l, self.num_heads, self.head_dim),
            dt,
            A,
            B.reshape(b, l, self.groups, self.state_size),
            C.reshape(b, l, self.groups, self.state_size),
        )

    def new_cache(
        self, batch: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> MambaCache:
        """Zero conv window and SSM state (fp32, as the scan keeps it); ``capacity`` is moot:
        the state does not grow with the sequence."""
        c = self.config
        return MambaCache(
            conv=torch.zeros(batch, self.conv_dim, c.conv_kernel - 1, device=device, dtype=dtype),
            ssm=torch.zeros(
                batch,
                self.num_heads,
                self.head_dim,
                self.state_size,
                device=device,
                dtype=torch.float32,
            ),
        )

    def forward(
        self,
        hidden: torch.Tensor,
        cache: MambaCache | None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prefill: ``hidden [b, l, H]`` to ``[b, l, H]``; fills ``cache`` when given. Decode
        (``positions`` given): :meth:`step`."""
        if positions is not None:
            assert cache is not None, "decoding needs the cache"
            return self.step(hidden, cache)
        b, l, _ = hidden.shape
        z, xbc, dt = self._split(hidden)
        k = self.config.conv_kernel
        conv = causal_conv1d(xbc.transpose(1, 2), self.conv1d.weight[:, 0], self.conv1d.bias, None)
        x, dt, A, B, C = self._ssm_inputs(conv.transpose(1, 2), dt)
        dt = dt * _valid_steps(lengths, b, l, hidden.device)[..., None]  # padding: dt = 0
        y, state = ssd_chunked(x, dt, A, B, C, self.D, self.config.chunk_size)
        if cache is not None:
            ends = lengths if lengths is not None else torch.full((b,), l, device=hidden.device)
            # The window holds the inputs at steps end-K+1 .. end-1: indices end .. end+K-2 in
            # the left-padded sequence.
            index = ends[:, None] + torch.arange(k - 1, device=hidden.device)[None, :]
            padded = F.pad(xbc.transpose(1, 2), (k - 1, 0))  # [b, conv_dim, K-1+l]
            cache.conv = padded.gather(2, index[:, None, :].expand(-1, self.conv_dim, -1))
            cache.ssm = state
        return self._output(y.reshape(b, l, self.inner), z)

    def step(self, hidden: torch.Tensor, cache: MambaCache) -> torch.Tensor:
        """Decode one token per sequence: ``hidden [b, 1, H]``; updates ``cache`` in place."""
        z, xbc, dt = self._split(hidden)
        inputs = xbc.transpose(1, 2)  # [b, conv_dim, 1]
        conv = causal_conv1d(inputs, self.conv1d.weight[:, 0], self.conv1d.bias, cache.conv)
        cache.conv = torch.cat([cache.conv, inputs], dim=-1)[..., 1:]
        x, dt, A, B, C = self._ssm_inputs(conv.transpose(1, 2), dt)
        y, cache.ssm = ssd_sequential(x, dt, A, B, C, self.D, cache.ssm)
        return self._output(y.reshape(hidden.shape[0], 1, self.inner), z)

    def _output(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out_proj(self.norm(y, z).to(z.dtype))
        return out


class Attention(Mixer[KVCache]):
    """Causal grouped-query attention, no positional encoding: fused ``qkv_proj``, ``o_proj``,
    no biases (vLLM and transformers both ignore ``attention_bias``)."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.attention_head_dim,
        )
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, c.hidden_size, bias=False)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, l, _ = x.shape
        q, k, v = torch.split(self.qkv_proj(x), [self.q_size, self.kv_size, self.kv_size], -1)
        return (
            q.reshape(b, l, self.heads, self.head_dim).transpose(1, 2),
            k.reshape(b, l, self.kv_heads, self.head_dim).transpose(1, 2),
            v.reshape(b, l, self.kv_heads, self.head_dim).transpose(1, 2),
        )

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``q [b, a, l, d]``, ``k, v [b, k, s, d]``; each key head serves ``a/k`` query heads."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
        b, _, l, _ = q.shape
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, l, self.q_size))
        return projected

    def new_cache(
        self, batch: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        """Zero keys and values for ``capacity`` positions."""
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        return KVCache(
            torch.zeros(shape, device=device, dtype=dtype),
            torch.zeros(shape, device=device, dtype=dtype),
        )

    def forward(
        self,
        hidden: torch.Tensor,
        cache: KVCache | None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prefill ``[b, l, H]``; writes positions ``0..l-1`` of ``cache`` when given. No need of
        ``lengths``: attention is causal, real tokens never see padding. Decode: :meth:`step`."""
        if positions is not None:
            assert cache is not None, "decoding needs the cache"
            return self.step(hidden, cache, positions)
        q, k, v = self._qkv(hidden)
        if cache is not None:
            cache.k[:, :, : k.shape[2]] = k
            cache.v[:, :, : v.shape[2]] = v
        return self._attend(q, k, v, None)

    def step(self, hidden: torch.Tensor, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        """One token per sequence at position ``lengths[i]``: written there, then attends to
        positions ``0..lengths[i]``."""
        q, k, v = self._qkv(hidden)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        cache.k[rows, :, lengths] = k[:, :, 0]
        cache.v[rows, :, lengths] = v[:, :, 0]
        visible = torch.arange(cache.k.shape[2], device=hidden.device)[None, :] <= lengths[:, None]
        return self._attend(q, cache.k, cache.v, visible[:, None, None, :])


class MLP(Mixer[None]):
    """Non-gated ``down_proj(relu2(up_proj(x)))``; also MoE's shared experts."""

    def __init__(self, hidden_size: int, width: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, hidden_size, bias=bias)

    @classmethod
    def from_config(cls, config: NemotronHConfig, layer: int) -> Self:
        """Widths may differ per layer (``mlp_width``)."""
        return cls(config.hidden_size, config.mlp_width(layer), config.mlp_bias)

    def forward(
        self,
        hidden: torch.Tensor,
        cache: None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(relu2(self.up_proj(hidden)))
        return out


class Router(nn.Module):
    """Sigmoid scores in fp32; the correction bias only steers the choice (DeepSeek-V3
    "noaux_tc"): pick ``topk_group`` groups by the sum of each group's two best biased scores,
    then the top ``num_experts_per_tok`` experts within them; weight by the unbiased scores,
    renormalised if ``norm_topk_prob``, times ``routed_scaling_factor``."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(
            torch.zeros(config.n_routed_experts, dtype=torch.float32), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, H]`` to routing weights ``[T, top_k]`` (fp32) and expert ids ``[T, top_k]``."""
        c = self.config
        scores = torch.sigmoid(x.float() @ self.weight.float().t())  # [T, E]
        choice = scores + self.e_score_correction_bias.float()
        per_group = c.n_routed_experts // c.n_group
        grouped = choice.reshape(-1, c.n_group, per_group)
        group_score = grouped.topk(min(2, per_group), dim=-1).values.sum(-1)  # [T, n_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(c.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        ids = choice.topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, ids)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * c.routed_scaling_factor, ids


class Experts(nn.Module):
    """``E`` non-gated experts, stacked: ``up_proj [E, F, R]``, ``down_proj [E, R, F]``."""

    def __init__(self, num: int, routed_size: int, width: int) -> None:
        super().__init__()
        self.up_proj = nn.Parameter(torch.randn(num, width, routed_size) / routed_size**0.5)
        self.down_proj = nn.Parameter(torch.randn(num, routed_size, width) / width**0.5)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``x [T, R]``, each token through its chosen experts, weighted and summed (fp32)."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in torch.unique(ids).tolist():
            token, slot = torch.where(ids == expert)
            y = relu2(x[token] @ self.up_proj[expert].t()) @ self.down_proj[expert].t()
            out.index_add_(0, token, y.float() * weights[token, slot, None])
        return out


class MoE(Mixer[None]):
    """Routed experts (optionally in a latent space: ``fc1_latent_proj`` before,
    ``fc2_latent_proj`` after) plus dense shared experts on the layer's input."""

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        c = config
        routed = c.moe_latent_size or c.hidden_size
        self.gate = Router(c)
        self.experts = Experts(c.n_routed_experts, routed, c.moe_intermediate_size)
        self.fc1_latent_proj: nn.Linear | None = None
        self.fc2_latent_proj: nn.Linear | None = None
        if c.moe_latent_size is not None:
            self.fc1_latent_proj = nn.Linear(c.hidden_size, routed, bias=c.mlp_bias)
            self.fc2_latent_proj = nn.Linear(routed, c.hidden_size, bias=c.mlp_bias)
        # vLLM sizes the shared MLP as moe_shared_expert_intermediate_size * n_shared_experts.
        self.shared_experts = (
            MLP(
                c.hidden_size,
                c.moe_shared_expert_intermediate_size * c.n_shared_experts,
                c.mlp_bias,
            )
            if c.n_shared_experts
            else None
        )

    def forward(
        self,
        hidden: torch.Tensor,
        cache: None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``hidden [b, l, H]``, each token routed on its own."""
        tokens = hidden.reshape(-1, hidden.shape[-1])
        weights, ids = self.gate(tokens)
        routed_in = self.fc1_latent_proj(tokens) if self.fc1_latent_proj is not None else tokens
        routed = self.experts(routed_in, weights, ids).to(hidden.dtype)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed)
        if self.shared_experts is not None:
            routed = routed + self.shared_experts(tokens)
        out: torch.Tensor = routed.reshape(hidden.shape)
        return out


#: The mixer of each layer kind (``config.layer_kinds``: pattern letters ``M * - E``), as
#: transformers' ``MIXER_TYPES`` and vLLM's ``ALL_DECODER_LAYER_TYPES``.
MIXERS: dict[str, type[Mixer[Any]]] = {
    "mamba": Mamba2Mixer,
    "attention": Attention,
    "mlp": MLP,
    "moe": MoE,
}

# ---------------------------------------------------------------------------------------------
# The model


class Block(nn.Module):
    """``x + mixer(norm(x))``."""

    def __init__(self, config: NemotronHConfig, layer: int) -> None:
        super().__init__()
        self.kind = config.layer_kinds[layer]
        self.norm = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.mixer = MIXERS[self.kind].from_config(config, layer)

    def forward(
        self,
        x: torch.Tensor,
        cache: LayerCache | None = None,
        lengths: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x [b, l, H]``; ``cache``, ``lengths``, ``positions`` go to the mixer (see
        :class:`Mixer`)."""
        out: torch.Tensor = x + self.mixer(self.norm(x), cache, lengths, positions)
        return out


class NemotronHModel(nn.Module):
    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon)

    @property
    def blocks(self) -> list[Block]:
        """``layers``, typed (``nn.ModuleList`` yields plain modules)."""
        return [cast(Block, layer) for layer in self.layers]


class NemotronHForCausalLM(nn.Module):
    """The language model: embeddings, the layer stack, ``norm_f``, the head (tied or not)."""

    # LoRA metadata, as vLLM's NemotronHForCausalLM declares it (see reference_impl.lora).
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"]
    }
    embedding_modules: ClassVar[dict[str, str]] = {
        "embed_tokens": "input_embeddings",
        "lm_head": "output_embeddings",
    }
    lora_skip_prefixes: ClassVar[list[str]] = ["mtp."]
    is_non_gated_moe: ClassVar[bool] = True

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.config = config
        self.model = NemotronHModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[b, l]`` token ids to ``[b, l, H]`` embeddings."""
        out: torch.Tensor = self.model.embed_tokens(input_ids)
        return out

    def new_cache(
        self,
        batch: int,
        capacity: int,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> InferenceCache:
        """Empty caches for ``batch`` sequences of up to ``capacity`` tokens."""
        weight = self.lm_head.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        layers = [
            block.mixer.new_cache(batch, capacity, device, dtype) for block in self.model.blocks
        ]
        lengths = torch.zeros(batch, dtype=torch.int64, device=device)
        return InferenceCache(layers=layers, lengths=lengths, capacity=capacity)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: InferenceCache | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[b, l, V]`` for token ids ``[b, l]`` or embeddings ``[b, l, H]``.

        - No cache: one causal pass over the whole sequences.
        - An empty cache: prefill; the caches are filled, ``cache.lengths`` set to ``lengths``.
        - A filled cache: decode, ``l == 1``: one new token per sequence.

        ``lengths [b]``: real tokens per (right-padded) sequence; default all ``l``.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("forward: expected exactly one of input_ids or inputs_embeds")
        if inputs_embeds is not None:
            x = inputs_embeds
        else:
            assert input_ids is not None
            x = self.embed_input_ids(input_ids)
        l = x.shape[1]
        if lengths is not None and (lengths.min() < 1 or lengths.max() > l):
            raise ValueError(f"lengths: expected values in [1, {l}], got {lengths.tolist()}")
        decoding = cache is not None and not cache.is_empty
        if decoding:
            assert cache is not None
            if l != 1:
                raise ValueError(f"input: a filled cache decodes one token at a time, got l={l}")
            if int(cache.lengths.max()) >= cache.capacity:
                raise ValueError(f"cache: full at capacity {cache.capacity}")
        elif cache is not None and l > cache.capacity:
            raise ValueError(f"cache: capacity {cache.capacity} is smaller than the prompt ({l})")
        # Decoding, each sequence's new token goes at its own position: the tokens it has seen.
        positions = cache.lengths if decoding and cache is not None else None
        for i, block in enumerate(self.model.blocks):
            x = block(x, cache.layers[i] if cache is not None else None, lengths, positions)
        if cache is not None:
            if decoding:
                cache.lengths = cache.lengths + 1
            else:
                cache.lengths = lengths.clone() if lengths is not None else cache.lengths + l
        logits: torch.Tensor = self.lm_head(self.model.norm_f(x))
        return logits

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Greedy decoding: ``[b, l]`` right-padded prompts to ``[b, max_new_tokens]`` tokens."""
        b, l = input_ids.shape
        cache = self.new_cache(b, l + max_new_tokens)
        logits = self(input_ids, cache=cache, lengths=lengths)
        last = (lengths - 1) if lengths is not None else torch.full((b,), l - 1)
        token = logits[torch.arange(b), last.to(logits.device)].argmax(-1)
        out = [token]
        for _ in range(max_new_tokens - 1):
            token = self(token[:, None], cache=cache)[:, -1].argmax(-1)
            out.append(token)
        return torch.stack(out, dim=1)
