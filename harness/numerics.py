"""The numerics a result was computed under, besides its inputs: torch's intra-op thread count.

On some CPUs torch splits a matrix product's reduction by its thread count, so the same
computation on the same inputs gives other bits at another count (measured on a 2-core CPU with
AMX: vLLM's tower rows for one request at 1 and at 2 threads differ by a bf16 rounding step on
some elements, 0.03 to 0.08 absolute; bit-identical at one count). The main job changes a
process's count between checks as its other processes end (:mod:`harness.plugin.cores`), so a
result kept by one check and compared bit for bit by a later one is kept under the
:class:`Numerics` it was computed with, and computed again under others
(:class:`harness.plugin.target.RequestRuns`). A comparison within a bound needs no such care:
another thread count rounds the same computation otherwise, by the same unit roundoff the bound
already allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Numerics:
    """What, besides its inputs, decides a result's bits in this process."""

    #: torch's intra-op thread count (``torch.get_num_threads()``).
    threads: int


def current_numerics() -> Numerics:
    """The numerics a computation started now runs under."""
    return Numerics(threads=torch.get_num_threads())
