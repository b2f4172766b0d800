"""The machine a run lands on, as far as its numbers depend on it: the CPU family.

bf16 products run through different kernels on different CPUs (oneDNN's AMX tiles where the CPU
has AMX; AVX-512 or AVX2 code otherwise; vLLM's CPU attention takes its ``"amx"`` path on AMX),
and each family gives other bits for the same computation: measured bounds are calibrated per
family (:mod:`harness.oracles.engine_bounds`). The family is read from the CPU's flags as the
kernels' own dispatch reads them (``cpuid``, which ``/proc/cpuinfo`` lists), so that the report
can name it without torch. Standard library only.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

#: The flags each family needs, widest first: the first family whose flags the CPU has is its.
FAMILY_FLAGS: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx", frozenset({"amx_tile", "amx_bf16"})),
    ("avx512", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
    ("avx2", frozenset({"avx2", "fma"})),
)


def cpu_info(text: str | None = None) -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags, from ``text`` (``/proc/cpuinfo`` where not given; empty
    where the system has none)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:  # not Linux: no flags to read
            text = ""
    model, flags = platform.processor() or "unknown", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == (platform.processor() or "unknown"):
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def family_of(flags: frozenset[str]) -> str:
    """The family of a CPU with ``flags`` (:data:`FAMILY_FLAGS`); ``unknown`` for none."""
    for family, needed in FAMILY_FLAGS:
        if needed <= flags:
            return family
    return "unknown"


def cpu_family() -> str:
    """This machine's CPU family: ``amx``, ``avx512``, ``avx2`` or ``unknown``."""
    return family_of(cpu_info()[1])


def cpu_description() -> dict[str, object]:
    """This machine as a calibration records it: its family, the instructions that decide it,
    the CPU's model name and core count, and torch's own view (its capability, AMX, AVX-512
    bf16) where torch is installed."""
    model, flags = cpu_info()
    described: dict[str, object] = {
        "family": family_of(flags),
        "flags": sorted(f for f in flags if f.startswith(("amx", "avx512", "avx2"))),
        "cpu": model,
        "cores": os.cpu_count(),
    }
    try:
        import torch
    except ImportError:  # the family stands on the flags alone
        return described
    return {
        **described,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "amx": torch.cpu._is_amx_tile_supported(),
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
    }
