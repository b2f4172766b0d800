"""Where each target's checks run: which Python, which suite, which fork server.

Most targets run ``suites/conformance`` in this environment, forked from a server that imported
torch (and vLLM) once (:mod:`harness.jobs.forkserver`). The ``vllm-engine`` target runs the engine
checks (``suites/engine``) and the server's (``suites/server``) in the CPU build's environment, a
Python of its own (``.nox/engine``, built by nox; :data:`ENGINE_PYTHON_ENV` names another),
started afresh: no fork server holds that environment's vLLM; ``vllm-cpu`` runs
``suites/conformance`` there. Standard library only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT
from harness.jobs.forkserver import kind_of

ENGINE_TARGET = "vllm-engine"
#: The CPU build's components under the conformance suites (the release matrix's 0.32 leg).
CPU_BUILD_TARGET = "vllm-cpu"
#: The engine target over files under test (``vllm-engine-file:PATH[,PATH...]``).
ENGINE_FILE_TARGET = "vllm-engine-file:"
#: The engine environment nox builds.
ENGINE_ENV = ROOT / ".nox" / "engine"
#: A variable naming the engine environment's Python instead of :data:`ENGINE_ENV`'s.
ENGINE_PYTHON_ENV = "NEMOTRON_VL_ENGINE_PYTHON"
CONFORMANCE_SUITE = "suites/conformance"
#: The engine target's suites: its engines (``vllm.LLM``), then its servers (``vllm serve``).
ENGINE_SUITES = ("suites/engine", "suites/server")


class RuntimeMissing(RuntimeError):
    """A target's environment is not there; the message says how to build it."""


@dataclass(frozen=True)
class TargetRuntime:
    """A target's Python, the suites its checks are in, and its fork server's kind (None: its
    processes start afresh). ``suite_groups``: where it runs as groups, each suite is one, its
    vLLM workers bound to cores of their own (:func:`group_cores`)."""

    python: str
    suites: tuple[str, ...]
    fork_kind: str | None
    suite_groups: bool = False
    #: Its checks' time limit unless the caller sets one (None: the main job's default).
    check_timeout_s: float | None = None


def engine_python() -> Path | None:
    """The engine environment's Python (:data:`ENGINE_PYTHON_ENV`, else :data:`ENGINE_ENV`'s),
    or None where there is none with the CPU build of vLLM installed."""
    named = os.environ.get(ENGINE_PYTHON_ENV)
    python = Path(named) if named else ENGINE_ENV / "bin" / "python"
    if not python.is_file():
        return None
    env = python.parent.parent
    if not any(env.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info")):
        return None
    return python


#: The engine target's check limit: its checks start vLLM's processes (an engine or a server, 16
#: to 24 s alone; the slowest check, a server's first, took up to 124 s beside the other targets
#: on 2 cores, measured), which a loaded or slower machine stretches.
ENGINE_CHECK_TIMEOUT_S = 360.0
#: The variable that binds the CPU build's workers to cores (vLLM's own; "auto" by default).
CORES_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def available_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def group_cores(group: tuple[int, int], cores: list[int]) -> str:
    """The cores group ``K/N`` binds its vLLM workers to, in ``VLLM_CPU_OMP_THREADS_BIND``'s
    terms: the K-th of N contiguous shares of ``cores`` (vLLM's "auto" binds every engine's
    worker to the same cores, the first ones: two groups' workers would share one core while
    another sat idle). Fewer cores than groups: the groups share them round."""
    index, count = group
    if not cores:
        raise ValueError("group_cores: expected at least one core, got none")
    if not 1 <= index <= count:
        raise ValueError(f"group_cores: expected 1 <= K <= N, got {index}/{count}")
    if len(cores) < count:
        return str(cores[(index - 1) % len(cores)])
    size, extra = divmod(len(cores), count)
    start = (index - 1) * size + min(index - 1, extra)
    share = cores[start : start + size + (1 if index <= extra else 0)]
    return ",".join(str(c) for c in share)


def runtime_of(selector: str) -> TargetRuntime:
    """Where ``selector``'s checks run; :class:`RuntimeMissing` for an engine target without its
    environment."""
    engine = selector == ENGINE_TARGET or selector.startswith(ENGINE_FILE_TARGET)
    if engine or selector == CPU_BUILD_TARGET:
        python = engine_python()
        if python is None:
            raise RuntimeMissing(
                f"target {selector}: expected the CPU build of vLLM's environment at "
                f"{os.environ.get(ENGINE_PYTHON_ENV) or ENGINE_ENV} (nox -s conformance builds "
                f"it; {ENGINE_PYTHON_ENV} names another), found none"
            )
        if engine:
            # Its engines and its servers are independent, and most of their time is vLLM's
            # processes starting (two new Pythons importing vLLM per engine, three per server):
            # side by side on 2 cores both suites took 242 s, one after the other 380 s.
            return TargetRuntime(
                str(python),
                ENGINE_SUITES,
                None,
                suite_groups=True,
                check_timeout_s=ENGINE_CHECK_TIMEOUT_S,
            )
        return TargetRuntime(str(python), (CONFORMANCE_SUITE,), None)
    return TargetRuntime(sys.executable, (CONFORMANCE_SUITE,), kind_of(selector))
