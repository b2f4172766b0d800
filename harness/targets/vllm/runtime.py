"""What running vLLM's classes on a CPU-only host takes, once per process.

- ``VLLM_TARGET_DEVICE=cpu`` and offline hubs before the first ``import vllm``;
- a current ``VllmConfig``, a one-process gloo "distributed" group and model-parallel groups
  (vLLM's parallel layers look them up when they are built);
- post-load processing as on a CPU without AVX512-BF16 and without AMX: on a host with
  AVX512-BF16 vLLM would pack the Mamba conv1d weights with ``causal_conv1d_weight_pack``, on one
  with AMX tiles the small bf16 linears and the embedding with ``convert_weight_packed``
  (``check_cpu_sgl_kernel``): compiled ops that vLLM's CUDA wheel lacks;
- on a release whose CPU platform refuses x86 without Triton's CPU backend (0.34.0 and later:
  ``RuntimeError: vLLM on x86 CPUs requires Triton (triton-cpu).``), that refusal lifted for
  the config check alone (:data:`TRITON_CPU_ADAPTATION`): the harness's report names it.
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
from harness.release_environments import installed_release
from harness.targets.base import TargetUnavailable

_RUNTIME: dict[str, Any] = {}


def prepare_cpu_environment() -> None:
    """Environment vLLM needs on a CPU-only host; must run before the first ``import vllm``."""
    environment.apply(environment.CPU)


def vllm_version() -> str | None:
    """The installed vLLM's version without importing it (the release's, or the CPU build's,
    whichever this environment has), or None when it is absent."""
    return installed_release()


def import_vllm_module(name: str) -> types.ModuleType:
    """Import a vLLM module on CPU; :class:`TargetUnavailable` when vLLM is not installed."""
    prepare_cpu_environment()
    if vllm_version() is None:
        raise TargetUnavailable(
            "vLLM is not installed (nox installs it: harness/release_environments.py)"
        )
    adapt_cpu_platform()
    return importlib.import_module(name)


#: The one adaptation the harness makes to a vLLM release so that its Python runs on this CPU,
#: and why it leaves what the checks compare unchanged. Named in every report whose target it
#: was applied to (:func:`applied_adaptations`).
TRITON_CPU_ADAPTATION = {
    "name": "triton-cpu refusal lifted",
    "what": (
        "CpuPlatform.check_and_update_config runs with vllm.triton_utils.HAS_TRITON read as "
        "True for the duration of that call only, so that its refusal of x86 CPUs without "
        "Triton's CPU backend ('vLLM on x86 CPUs requires Triton (triton-cpu).') does not fire"
    ),
    "why_unchanged": (
        "the refusal guards the x86 CPU model runner, whose slot-mapping and sampling kernels "
        "are Triton programs; the checks of this target never start that runner: they call "
        "vLLM's processor, constructor, loader, towers, connector and layers in this process, "
        "which run torch operations, and everywhere else HAS_TRITON keeps its real value "
        "(False), so no Triton kernel can be chosen"
    ),
}
REFUSAL = "requires Triton (triton-cpu)"
_APPLIED: list[dict[str, str]] = []
_ADAPTED: list[bool] = []  # adapt_cpu_platform ran in this process


def adapt_cpu_platform() -> None:
    """Lift the installed release's refusal of x86 CPUs without triton-cpu, where it has one
    and this machine meets it (see :data:`TRITON_CPU_ADAPTATION`); otherwise nothing. Once per
    process, before the first ``VllmConfig``."""
    if _ADAPTED:
        return
    _ADAPTED.append(True)
    import inspect

    cpu = importlib.import_module("vllm.platforms.cpu")
    triton_utils: Any = importlib.import_module("vllm.triton_utils")
    platform = cpu.CpuPlatform
    original = platform.check_and_update_config.__func__
    if REFUSAL not in inspect.getsource(original) or triton_utils.HAS_TRITON:
        return
    if platform.get_cpu_architecture() != cpu.CpuArchEnum.X86:
        return

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            original(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    platform.check_and_update_config = classmethod(check_and_update_config)
    _APPLIED.append(TRITON_CPU_ADAPTATION)


def applied_adaptations() -> list[dict[str, str]]:
    """The adaptations :func:`adapt_cpu_platform` made in this process (none on a release
    that runs here as it is)."""
    return list(_APPLIED)


def init_cpu_runtime() -> None:
    """The process-wide setup, once."""
    if _RUNTIME:
        return
    prepare_cpu_environment()
    adapt_cpu_platform()
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
