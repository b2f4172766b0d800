"""Independent implementations the reference is checked against, built with random weights.

``transformers``' ``NemotronHForCausalLM`` runs every NemotronH layer kind on CPU through its
pure-PyTorch fallbacks. Where it differs from vLLM by design, the builder makes the difference
explicit: transformers clamps ``dt`` from below at ``time_step_min`` (vLLM and the reference use
``(0, inf)``); ``dt_clamp=False`` removes the clamp after construction (``time_step_min=0`` is not
possible at construction: its weight init takes ``log(time_step_min)``). It also ignores
``tie_word_embeddings`` (so does vLLM); for a tied config the builder ties the head by value.
"""

from __future__ import annotations

from typing import Any

import torch

from reference_impl.config import NemotronHConfig
from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.weights import load_state_dict


def transformers_nemotron_h(
    config: NemotronHConfig, *, seed: int = 0, scale: float = 0.2, dt_clamp: bool = False
) -> Any:
    """transformers' model for ``config``, with every weight drawn from N(0, scale²) (the MoE
    correction bias too), in eval mode."""
    from transformers.models.nemotron_h import NemotronHConfig as HFConfig
    from transformers.models.nemotron_h import NemotronHForCausalLM as HFModel

    torch.manual_seed(seed)
    model = HFModel(HFConfig(**config.to_transformers_dict())).eval()
    generator = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors |= {n: b for n, b in model.named_buffers() if "e_score_correction_bias" in n}
    with torch.no_grad():
        for tensor in tensors.values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    if config.tie_word_embeddings:
        # transformers' NemotronH (like vLLM's) ignores tie_word_embeddings: tie by value.
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embeddings.weight)
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    if not dt_clamp:
        for layer in model.model.layers:
            if hasattr(layer.mixer, "time_step_limit"):
                layer.mixer.time_step_limit = (0.0, float("inf"))
    return model


def reference_from(hf_model: Any, config: NemotronHConfig) -> NemotronHForCausalLM:
    """Our model with ``hf_model``'s weights, loaded through the checkpoint-name loader."""
    model = NemotronHForCausalLM(config).eval()
    load_state_dict(model, dict(hf_model.state_dict()))
    return model
