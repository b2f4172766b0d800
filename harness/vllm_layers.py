"""vLLM's own layers on CPU, as independent implementations for the reference's parity tests.

Running vLLM modules outside an engine takes, once per process: a current ``VllmConfig``, a
one-process gloo "distributed" group and model-parallel groups; and after building a module,
``process_weights_after_loading`` on each linear layer's quant method (the CPU linear kernels
are set up there). This module owns those steps, so tests never import vLLM directly.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch import nn

from harness.targets.vllm import prepare_cpu_environment
from reference_impl.audio import AudioConfig
from reference_impl.radio import RadioConfig

_RUNTIME: dict[str, Any] = {}


def init_cpu_runtime() -> None:
    """The process-wide setup, once."""
    if _RUNTIME:
        return
    prepare_cpu_environment()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    context = set_current_vllm_config(VllmConfig())
    context.__enter__()
    handle, path = tempfile.mkstemp(prefix="vllm-dist-")
    os.close(handle)
    os.unlink(path)
    init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{path}", local_rank=0, backend="gloo"
    )
    initialize_model_parallel(1, 1)
    _RUNTIME["context"] = context


def finish(module: nn.Module) -> nn.Module:
    """``process_weights_after_loading`` on every layer with a quant method; eval mode."""
    for layer in module.modules():
        method = getattr(layer, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(layer)
    return module.eval()


def radio(config: RadioConfig, weights: dict[str, torch.Tensor]) -> Any:
    """vLLM's ``RadioModel`` for ``config`` (width from the model-name table, depth overridden),
    loaded with checkpoint-named ``weights`` through vLLM's own ``load_weights``."""
    init_cpu_runtime()
    from vllm.model_executor.models.radio import RadioModel
    from vllm.transformers_utils.configs.radio import RadioConfig as VllmRadioConfig

    vllm_config = VllmRadioConfig(
        model_name=config.model_name,
        image_size=config.image_size,
        patch_size=config.patch_size,
        register_multiple=config.register_multiple,
        cpe_max_size=config.cpe_max_size,
        video_temporal_patch_size=config.video_temporal_patch_size,
        separate_video_embedder=config.separate_video_embedder,
        layer_norm_eps=config.layer_norm_eps,
    )
    model = RadioModel(vllm_config, num_hidden_layers_override=config.num_layers)
    model.load_weights(weights)
    return finish(model)


def parakeet(
    config: AudioConfig, weights: dict[str, torch.Tensor], max_model_len: int = 4096
) -> Any:
    """vLLM's ``ProjectedParakeet`` (transformers' encoder + vLLM's projection) in fp32, loaded
    with checkpoint-named ``weights`` (``sound_encoder.encoder.*``, ``sound_projection.*``)
    through its ``load_weights``, which skips names with any other prefix silently: the caller
    checks that every parameter was loaded."""
    init_cpu_runtime()
    from transformers import PretrainedConfig
    from vllm.model_executor.models.parakeet import ProjectedParakeet

    sound = PretrainedConfig(
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        conv_kernel_size=config.conv_kernel_size,
        subsampling_factor=config.subsampling_factor,
        subsampling_conv_channels=config.subsampling_conv_channels,
        subsampling_conv_kernel_size=config.subsampling_conv_kernel_size,
        subsampling_conv_stride=config.subsampling_conv_stride,
        num_mel_bins=config.num_mel_bins,
        convolution_bias=config.convolution_bias,
        projection_hidden_size=config.projection_hidden_size,
        projection_bias=config.projection_bias,
        projection_eps=config.projection_eps,
        sampling_rate=config.sampling_rate,
        hidden_act="silu",
    )
    model = ProjectedParakeet(
        sound,
        dtype=torch.float32,
        llm_hidden_size=config.llm_hidden_size,
        max_model_len=max_model_len,
    )
    loaded = model.load_weights(weights.items())
    missing = sorted({n for n, _ in model.named_parameters()} - loaded)
    if missing:
        raise ValueError(f"vLLM ProjectedParakeet: parameters not loaded: {missing}")
    return finish(model)
