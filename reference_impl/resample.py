"""Audio at another sampling rate, brought to the model's: band-limited interpolation.

A clip sampled at ``source_rate`` is a band-limited signal; its value at any time is the sum of
its samples weighted by a low-pass interpolation kernel. The kernel here is a sinc whose cutoff is
``rolloff`` times the Nyquist frequency of the lower of the two rates (so that nothing above the
target's Nyquist folds back), windowed by a Hann window ``cos²`` that reaches zero after
``zero_crossings`` of the sinc on each side. These are the published defaults of the resampler
vLLM's media loader uses for audio (a Hann-windowed sinc, 6 zero crossings, rolloff 0.99);
``suites/reference/test_resample.py`` checks the result against torchaudio's implementation.

In units where ``L = source_rate / g`` input samples and ``M = target_rate / g`` output samples
span one unit of time (``g`` their greatest common divisor), with ``beta = rolloff * min(L, M)``
the kernel's zero-crossing rate, the output sample ``n`` is::

    y[n] = sum_k x[k] * (beta / L) * sinc(u) * cos²(pi * u / (2 * zero_crossings)),
    u = beta * (n / M - k / L),  |u| <= zero_crossings

and ``ceil(len(x) * M / L)`` output samples are kept. Output ``n = q * M + p`` only depends on
its phase ``p``: the kernel is one row per phase, slid ``L`` input samples per step.

Glossary: ``n`` samples in, ``m`` samples out, ``P`` phases (``M``), ``K`` kernel taps.
"""

from __future__ import annotations

import math

import torch

from reference_impl.errors import ConfigError

ZERO_CROSSINGS = 6
ROLLOFF = 0.99
#: The most kernel taps (phases x taps per phase) a pair of rates may need: rates whose ratio
#: reduces to no small fraction (16001 Hz to 16 kHz: 16,000 phases) would need gigabytes.
MAX_KERNEL_TAPS = 1 << 24


def _phase_kernels(source: int, target: int, zero_crossings: int, rolloff: float) -> torch.Tensor:
    """``[P, K]`` float64: the kernel of each output phase over the input samples from ``-W``
    to ``W + L - 1`` around the phase's block (``W`` the kernel's half-width in input samples)."""
    beta = rolloff * min(source, target)
    half_width = math.ceil(zero_crossings * source / beta)
    offsets = torch.arange(-half_width, half_width + source, dtype=torch.float64) / source
    phases = torch.arange(target, dtype=torch.float64)[:, None] / target
    u = beta * (phases - offsets[None, :])
    window = torch.where(
        u.abs() <= zero_crossings,
        torch.cos(math.pi * u / (2 * zero_crossings)) ** 2,
        torch.zeros_like(u),
    )
    return (beta / source) * torch.sinc(u) * window


def resample(
    samples: torch.Tensor,
    source_rate: int,
    target_rate: int,
    *,
    zero_crossings: int = ZERO_CROSSINGS,
    rolloff: float = ROLLOFF,
) -> torch.Tensor:
    """``[n]`` float samples at ``source_rate`` -> ``[m]`` float32 at ``target_rate``,
    ``m = ceil(n * target_rate / source_rate)``; the same samples when the rates agree."""
    for name, rate in (("source_rate", source_rate), ("target_rate", target_rate)):
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ConfigError(name, "a positive int (Hz)", rate)
    if samples.dim() != 1 or not samples.is_floating_point():
        raise ConfigError("samples", "a [n] float tensor", (tuple(samples.shape), samples.dtype))
    if source_rate == target_rate:
        return samples.float()
    g = math.gcd(source_rate, target_rate)
    source, target = source_rate // g, target_rate // g
    if target * (source + 2 * zero_crossings * source) > MAX_KERNEL_TAPS:
        raise ConfigError(
            "source_rate",
            f"a rate whose ratio to {target_rate} Hz reduces to at most {MAX_KERNEL_TAPS} "
            "kernel taps (such as 8, 11.025, 22.05, 24, 32, 44.1 or 48 kHz)",
            source_rate,
        )
    kernels = _phase_kernels(source, target, zero_crossings, rolloff)  # [P, K]
    half_width = (kernels.shape[1] - source) // 2
    n = samples.shape[0]
    out_len = math.ceil(n * target / source)
    blocks = math.ceil(out_len / target)
    # Zeros before the first sample and after the last, so every block sees all K taps.
    right = max(0, blocks * source + kernels.shape[1] - source - n - half_width)
    padded = torch.nn.functional.pad(samples.double(), (half_width, right))
    windows = padded.unfold(0, kernels.shape[1], source)[:blocks]  # [blocks, K]
    out = windows @ kernels.T  # [blocks, P]: output q * M + p
    return out.reshape(-1)[:out_len].float()
