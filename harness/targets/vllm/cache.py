"""The caches vLLM sizes for a served model, asked as its engine asks them, without an engine.

On the engine's platform (this machine's): the model built by vLLM's constructor under the
serving configuration's engine config, then ``current_platform.update_block_size_for_backend``
(which the engine calls once the model is loaded: it reads the built attention layers), then
each KV-cache layer's ``get_kv_cache_spec`` as the model runner collects them (attention specs
customised for their backend).

For a CUDA GPU (``platform="cuda"``): the base ``Platform.update_block_size_for_backend``, which
CUDA's platform does not override, with CUDA's default attention backend (Triton's, whose kernel
blocks are multiples of 16 as FlashAttention's are) on a fresh engine config: the block sizing a
CUDA user gets, computed on a CPU. No model is built there, so no per-layer specs.
"""

from __future__ import annotations

from typing import Any

from harness.targets.base import CacheLayout
from harness.targets.vllm import build


def engine_layout(module: Any, vllm_config: Any) -> CacheLayout:
    """The cache layout on this machine's platform, for a fresh ``vllm_config``."""
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec
    from vllm.v1.worker.utils import customize_attention_spec

    build.construct(module, vllm_config)
    try:
        current_platform.update_block_size_for_backend(vllm_config)
        attention, mamba = [], []
        with set_current_vllm_config(vllm_config):
            layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
            for layer in layers.values():
                spec = layer.get_kv_cache_spec(vllm_config)
                if isinstance(spec, AttentionSpec):
                    spec = customize_attention_spec(layer.get_attn_backend(), spec)
                    per_token = spec.page_size_bytes // spec.block_size
                    attention.append((spec.num_kv_heads, spec.head_size, spec.dtype, per_token))
                elif isinstance(spec, MambaSpec):
                    shapes = tuple(tuple(shape) for shape in spec.shapes)
                    mamba.append((shapes, tuple(spec.dtypes), int(spec.real_page_size_bytes)))
        return _layout(vllm_config, tuple(attention), tuple(mamba))
    finally:
        vllm_config.compilation_config.static_forward_context.clear()


def cuda_layout(vllm_config: Any) -> CacheLayout:
    """The block sizing a CUDA user's engine computes for a fresh ``vllm_config``."""
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    class CudaDefaults(Platform):  # type: ignore[misc]  # vLLM is untyped here
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return [TritonAttentionBackend]

    CudaDefaults.update_block_size_for_backend(vllm_config)
    return _layout(vllm_config, (), ())


def _layout(
    vllm_config: Any,
    attention: tuple[tuple[Any, ...], ...],
    mamba: tuple[tuple[Any, ...], ...],
) -> CacheLayout:
    cache = vllm_config.cache_config
    padded = cache.mamba_page_size_padded
    return CacheLayout(
        block_size=int(cache.block_size),
        mamba_block_size=int(cache.mamba_block_size),
        mamba_page_size_padded=None if padded is None else int(padded),
        mamba_cache_mode=str(cache.mamba_cache_mode),
        attention=attention,
        mamba=mamba,
    )
