"""Small building blocks shared by the language model and the connector."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``: normalised in fp32, cast back, then scaled (NemotronH's order)."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Mamba2's output norm: ``y * silu(z)`` first, then an RMSNorm within each of ``G`` groups
    of ``I/G`` channels (``norm_before_gate=False``), with one weight over all ``I`` channels."""

    def __init__(self, size: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        y32 = y.float() * nn.functional.silu(z.float())
        grouped = y32.reshape(*y32.shape[:-1], -1, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * grouped.reshape(y.shape).to(dtype)
        return out


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, window: torch.Tensor | None
) -> torch.Tensor:
    """Mamba2's depthwise causal convolution, then SiLU.

    ``x [b, D, l]`` (channels first), ``weight [D, K]``, ``bias [D]`` or None; ``window
    [b, D, K-1]``: the ``K-1`` inputs before ``x`` (zeros for a sequence's start, the cached
    window when resuming). Output ``y[:, :, t] = silu(bias + sum_j weight[:, j] * u[:, :, t+j])``
    over ``u = window ++ x``: ``[b, D, l]``.
    """
    b, channels, _ = x.shape
    k = weight.shape[-1]
    if window is None:
        window = x.new_zeros(b, channels, k - 1)
    inputs = torch.cat([window.to(x.dtype), x], dim=-1)  # [b, D, K-1+l]
    out = nn.functional.conv1d(inputs, weight[:, None, :], bias, groups=channels)
    return nn.functional.silu(out)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``relu(x) ** 2``, the activation of NemotronH's MLPs, experts and ``mlp1``."""
    return torch.relu(x).square()


class ReLUSquared(nn.Module):
    """:func:`relu2` as a module (``mlp1`` is an ``nn.Sequential``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu2(x)
