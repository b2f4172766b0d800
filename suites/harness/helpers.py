"""Helpers for the harness's own tests: run the suites in a child pytest process."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness.jobs.results import REPORT_SCHEMA, RESULTS_SCHEMA
from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_one

ROOT = Path(__file__).resolve().parents[2]


def vllm_installed() -> bool:
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_vllm = pytest.mark.skipif(
    not vllm_installed(), reason="vLLM is not installed (nox -s tests installs it)"
)


def run_suites(
    tmp_path: Path, *args: str, suite: str | tuple[str, ...] = "suites/conformance"
) -> SuiteRun:
    """``pytest <suite...> <args>`` in a forked child of this process (vLLM imported once for
    the session, not once per run), with per-check results as JSON."""
    suites = (suite,) if isinstance(suite, str) else suite
    _preload_once()
    # Its files (results.json, output.log) go to tmp_path.
    run = run_one(SuiteJob(" ".join(args), None, suites, tmp_path, args))
    if run.results is not None:
        validate(run.results, RESULTS_SCHEMA)  # every results document the tests produce
    assert not run.problems, f"{run.problems}\n{run.output[-3000:]}"
    return run


def run_installed_and_mutants(
    base: Path,
    installed: Sequence[str],
    mutants: dict[str, Sequence[str]],
    write_mutant: Callable[[str, Path], Path],
) -> dict[str, SuiteRun]:
    """The checks ``installed`` on the installed vLLM (key ``"installed"``) and each mutant's
    checks on it, written by ``write_mutant`` under ``base``, two forked children at a time."""
    from harness.mutation.runner import run_many

    jobs = [SuiteJob("installed", "vllm", tuple(installed), base / "installed")]
    for name, checks in mutants.items():
        target = f"vllm-file:{write_mutant(name, base / name / 'src')}"
        jobs.append(SuiteJob(name, target, tuple(checks), base / name))
    _preload_once()
    return {run.key: run for run in run_many(jobs, parallel=min(2, os.cpu_count() or 1))}


@functools.cache
def _preload_once() -> None:
    preload(vllm=vllm_installed())


def validate(document: Any, schema: Path) -> None:
    """``document`` against a committed JSON Schema (``fixtures/schema/``), references between
    the schemas resolved."""
    import jsonschema
    from referencing import Registry, Resource

    resources = [
        Resource.from_contents(json.loads(path.read_text()))
        for path in (RESULTS_SCHEMA, REPORT_SCHEMA)
    ]
    registry = Registry().with_resources((r.id(), r) for r in resources)
    contents = json.loads(schema.read_text())
    jsonschema.Draft202012Validator(contents, registry=registry).validate(document)


def run_forked(
    args: Sequence[str], *, module: str = "pytest", kind: str = "vllm", timeout_s: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` in the repository with one torch thread (it runs beside other
    work), its output and errors together in ``stdout``, as ``subprocess.run`` gives them:
    forked from the test run's fork server of ``kind`` (:mod:`harness.jobs.forkserver`, shared
    by the root conftest: vLLM imported once for the run, not once per command), else (no
    shared server, or this process's ``PYTHON*`` variables are not the server's) a new Python.
    A command that outlives ``timeout_s`` is killed, and the test fails."""
    from harness.jobs.forkserver import ForkServerError, shared_servers

    command = [sys.executable, "-m", module, *args]
    env = one_thread_env()
    servers = shared_servers([kind])
    try:
        if servers is None:
            raise ForkServerError("no shared fork server")
        child = servers[kind].start(list(args), env, ROOT, module=module)
    except ForkServerError:
        return subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    assert child.stdout is not None
    said: list[bytes] = []
    # A daemon reader: a descendant that keeps the pipe open cannot hang the test.
    reader = threading.Thread(target=lambda: said.append(child.stdout.read()), daemon=True)
    reader.start()
    try:
        try:
            status = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.signal_group(signal.SIGKILL)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.signal_group(signal.SIGKILL, direct=True)
            pytest.fail(f"{' '.join(command)}: still running after {timeout_s:g} s")
        reader.join(timeout=60)
    finally:
        child.stdout.close()
    output = said[0].decode(errors="replace") if said else "(its output pipe stayed open)"
    return subprocess.CompletedProcess(command, status, output, "")


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def one_thread_env() -> dict[str, str]:
    """The environment of a child process run beside another: one torch thread each, not two
    threads on each of two cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def selected_tests(request: pytest.FixtureRequest) -> list[pytest.Function]:
    """The selected tests of the module whose fixture asks (what a module fixture that makes
    the tests' runs up front must make, and no more)."""
    return [
        item
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
    ]


def selected_params(request: pytest.FixtureRequest, name: str) -> list[Any]:
    """The values of parameter ``name`` among the selected tests of the asking module, in order:
    what a module fixture that runs one job per value must run (a tier, ``-k``)."""
    found: list[Any] = []
    for item in selected_tests(request):
        callspec = getattr(item, "callspec", None)
        if callspec is not None and name in callspec.params:
            value = callspec.params[name]
            if value not in found:
                found.append(value)
    return found


def in_the_slow_tier(values: Sequence[str], default: Sequence[str]) -> list[Any]:
    """``values`` as parameters, those not in ``default`` marked for the slow tier
    (``exhaustive``: ``nox -s tests-slow``)."""
    unknown = sorted(set(default) - set(values))
    assert not unknown, f"the default tier names values that are not parameters: {unknown}"
    return [pytest.param(v, marks=[] if v in default else [pytest.mark.exhaustive]) for v in values]


def two_at_a_time(run: Callable[[K], V], keys: Sequence[K]) -> dict[K, V]:
    """``run(key)`` for each key, two at a time: each mostly waits on a child process's imports,
    and two use both cores of a 2-core machine."""
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        return dict(zip(keys, pool.map(run, keys), strict=True))
