"""The vision-to-language connector: pixel shuffle, then ``mlp1``.

Glossary: ``n`` images or frames, ``gh x gw`` the patch grid, ``C`` the vision width, ``r`` the
shuffle factor (2), ``h`` the language model's hidden size.

Mirrors vLLM's ``NemotronH_Nano_VL_V2.pixel_shuffle`` and ``mlp1`` (an ``nn.Sequential`` whose
indices 0, 1, 3 are the checkpoint's ``mlp1.0`` RMSNorm and ``mlp1.1`` / ``mlp1.3`` linears).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from reference_impl.config import VLConfig
from reference_impl.layers import ReLUSquared, RMSNorm


def pixel_shuffle(x: torch.Tensor, r: int, ps_version: str = "v2") -> torch.Tensor:
    """Fold each ``r x r`` block of patches into the channel axis.

    Args:
        x: ``[n, gh, gw, C]`` patch features.
    Returns:
        ``[n, gh/r, gw/r, C*r*r]``; the merged channel index is ``(dy*r + dx)*C + ch``. The legacy
        ``"v1"`` variant returns ``[n, gw/r, gh/r, C*r*r]`` (height and width left swapped).
    """
    n, gh, gw, c = x.shape
    x = x.reshape(n, gh // r, r, gw // r, r, c)
    if ps_version == "v1":
        warnings.warn(
            "ps_version 'v1' leaves height and width swapped: the output is transposed",
            stacklevel=2,
        )
        return x.permute(0, 3, 1, 2, 4, 5).reshape(n, gw // r, gh // r, c * r * r)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(n, gh // r, gw // r, c * r * r)


def build_mlp1(config: VLConfig) -> nn.Sequential:
    """``RMSNorm(C*r*r) -> Linear(C*r*r, projector) -> ReLU^2 -> Linear(projector, h)``."""
    return nn.Sequential(
        RMSNorm(config.connector_in_size, eps=1e-5),
        nn.Linear(config.connector_in_size, config.projector_hidden_size, bias=False),
        ReLUSquared(),
        nn.Linear(config.projector_hidden_size, config.hidden_size, bias=False),
    )


class Connector(nn.Module):
    """Patch features of whole tiles or frames to language-model embeddings."""

    def __init__(self, config: VLConfig) -> None:
        super().__init__()
        self.config = config
        self.mlp1 = build_mlp1(config)
        # vLLM 0.33.0: a LayerNorm on the vision features when the LM has MTP layers, with the
        # checkpoint's vision_config.layer_norm_eps.
        eps = config.vision_config.final_layernorm_eps if config.vision_config else 1e-6
        self.vision_final_layernorm = (
            nn.LayerNorm(config.vit_hidden_size, eps=eps) if config.vision_final_layernorm else None
        )

    def forward(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """
        Args:
            features: ``[n, gh*gw, C]`` vision features of ``n`` tiles or frames.
            grid: ``(gh, gw)``, the patch grid of each.
        Returns:
            ``[n, (gh/r)*(gw/r), h]``.
        """
        n = features.shape[0]
        gh, gw = grid
        if self.vision_final_layernorm is not None:
            features = self.vision_final_layernorm(features)
        x = features.reshape(n, gh, gw, -1)
        x = pixel_shuffle(x, self.config.shuffle_factor, self.config.ps_version)
        x = x.reshape(n, -1, x.shape[-1])
        dtype = next(self.mlp1.parameters()).dtype
        out: torch.Tensor = self.mlp1(x.to(dtype))
        return out
