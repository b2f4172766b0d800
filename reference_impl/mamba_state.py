"""One sequence's Mamba state, shape and dtype, from a config alone.

These helpers only *read* the config: a serving engine's config can hold live layers
(``nn.Parameter`` subclasses whose deep copy fails), so copying the whole config is never an
option (vLLM PR #38655).
"""

from __future__ import annotations

from typing import Any

import torch

from reference_impl.errors import ConfigError


def extra_groups_for_tp(n_groups: int, tp_size: int) -> int:
    """Groups added so that every tensor-parallel shard holds the groups its heads use."""
    return 0 if n_groups % tp_size == 0 else tp_size - n_groups


def mamba_state_shapes(
    text_config: Any, tp_size: int = 1, num_speculative_tokens: int = 0
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """One sequence's Mamba state per layer: the conv window ``(conv_dim / tp, K - 1 + spec)``
    and the SSM state ``(heads / tp, head_dim, N)``. Reads attributes only."""
    heads = int(text_config.mamba_num_heads)
    head_dim = int(text_config.mamba_head_dim)
    groups = int(text_config.n_groups)
    state = int(text_config.ssm_state_size)
    groups += extra_groups_for_tp(groups, tp_size)
    conv_dim = heads * head_dim + 2 * groups * state
    if conv_dim % tp_size or heads % tp_size:
        raise ConfigError("tp_size", f"a divisor of conv_dim={conv_dim} and heads={heads}", tp_size)
    conv = (conv_dim // tp_size, int(text_config.conv_kernel) - 1 + num_speculative_tokens)
    return conv, (heads // tp_size, head_dim, state)


_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "half": torch.float16,
    "float": torch.float32,
}


def mamba_state_dtypes(
    model_dtype: torch.dtype, mamba_cache_dtype: str = "auto", mamba_ssm_cache_dtype: str = "auto"
) -> tuple[torch.dtype, torch.dtype]:
    """(conv, ssm) state dtypes: ``"auto"`` follows the model (and the SSM the conv state)."""

    def resolve(name: str, default: torch.dtype, field: str) -> torch.dtype:
        if name == "auto":
            return default
        if name not in _DTYPES:
            raise ConfigError(field, f"'auto' or one of {sorted(_DTYPES)}", name)
        return _DTYPES[name]

    conv = resolve(mamba_cache_dtype, model_dtype, "mamba_cache_dtype")
    return conv, resolve(mamba_ssm_cache_dtype, conv, "mamba_ssm_cache_dtype")


def text_config_of(engine_config: Any) -> Any:
    """``engine_config.model_config.hf_config.text_config`` (or the hf_config itself for a
    text-only model), read without copying anything."""
    hf_config = engine_config.model_config.hf_config
    text = getattr(hf_config, "text_config", None)
    return hf_config if text is None else text


def mamba_state_shape_from_config(
    engine_config: Any,
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """The equivalent of ``NemotronH_Nano_VL_V2.get_mamba_state_shape_from_config``: shapes from
    the nested text config and the parallel / speculative settings. Never copies the config."""
    parallel = getattr(engine_config, "parallel_config", None)
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    spec = int(getattr(engine_config, "num_speculative_tokens", 0) or 0)
    return mamba_state_shapes(text_config_of(engine_config), tp, spec)


def mamba_state_dtype_from_config(engine_config: Any) -> tuple[torch.dtype, torch.dtype]:
    """The equivalent of ``get_mamba_state_dtype_from_config``; reads, never copies."""
    model_dtype = engine_config.model_config.dtype
    cache = getattr(engine_config, "cache_config", None)
    return mamba_state_dtypes(
        model_dtype,
        getattr(cache, "mamba_cache_dtype", "auto"),
        getattr(cache, "mamba_ssm_cache_dtype", "auto"),
    )
