"""vLLM's own layers on CPU, as independent implementations for the reference's parity tests.

Running vLLM modules outside an engine takes the process-wide runtime of
:mod:`harness.targets.vllm.runtime`, and after building a module
``process_weights_after_loading`` on each linear layer's quant method (the CPU linear kernels
are set up there): :func:`finish`. Tests reach vLLM's layers only through this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.targets.vllm.runtime import init_cpu_runtime, prepare_cpu_environment
from reference_impl.audio import AudioConfig
from reference_impl.radio import RadioConfig


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
        **config.encoder_fields(),
        projection_hidden_size=config.projection_hidden_size,
        projection_bias=config.projection_bias,
        projection_eps=config.projection_eps,
        sampling_rate=config.sampling_rate,
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


def mlp1(
    vit_hidden_size: int,
    projector_hidden_size: int,
    llm_hidden_size: int,
    weights: dict[str, torch.Tensor],
    shuffle_factor: int = 2,
) -> nn.Module:
    """vLLM's ``mlp1`` exactly as ``NemotronH_Nano_VL_V2.__init__`` builds it (vLLM's RMSNorm
    and ReLUSquaredActivation), loaded with ``weights`` (``0.weight``, ``1.weight``,
    ``3.weight``)."""
    init_cpu_runtime()
    from vllm.model_executor.layers.activation import ReLUSquaredActivation
    from vllm.model_executor.layers.layernorm import RMSNorm

    width = vit_hidden_size * shuffle_factor**2
    module = nn.Sequential(
        RMSNorm(hidden_size=width, eps=1e-5),
        nn.Linear(width, projector_hidden_size, bias=False),
        ReLUSquaredActivation(),
        nn.Linear(projector_hidden_size, llm_hidden_size, bias=False),
    )
    module.load_state_dict(weights)
    return finish(module)


def pixel_shuffle(x: torch.Tensor, ps_version: str = "v2") -> torch.Tensor:
    """vLLM's ``NemotronH_Nano_VL_V2.pixel_shuffle`` (a method that reads ``ps_version``)."""
    prepare_cpu_environment()
    from vllm.model_executor.models.nano_nemotron_vl import NemotronH_Nano_VL_V2

    holder = object.__new__(NemotronH_Nano_VL_V2)
    object.__setattr__(holder, "ps_version", ps_version)
    out: torch.Tensor = NemotronH_Nano_VL_V2.pixel_shuffle(holder, x, scale_factor=0.5)
    return out
