"""``nemotron-vl-scope``: measure the gate's scope, every function of vLLM this model's checks run.

    nemotron-vl-scope [--out fixtures/gate_scope.json] [--suites PATH ...]
    nemotron-vl-scope --engine [--out fixtures/gate_scope_engine.json]

The conformance suites run once against the installed vLLM (the ``vllm`` target) under
coverage.py over vLLM's whole package, one coverage context per check and per model build (a
build's lines count for every check that used it; the model files' functools caches emptied as
each check starts: :mod:`harness.mutation.reach_measure`'s contexts), with ``torch.compile`` off
so that compiled functions run as the Python they are traced from. Each line a check ran is
charged to the innermost function holding it; the table (:mod:`harness.jobs.scope`) keeps, per
file and function, the checks that ran it. Lines run outside every check (imports, collection)
count for none. It runs in a process of its own (it builds models); on 2 cores about ten
minutes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from harness import ROOT
from harness.jobs.results import replace_text
from harness.jobs.scope import (
    ENGINE_SCOPE_FILE,
    REFRESH,
    SCOPE_FILE,
    FunctionReach,
    Scope,
    ScopeError,
    functions_of,
    innermost_function,
    read_scope,
    summary,
)
from harness.mutation.reach import MEASURING_ENV, SUITES, attribute_lines


def vllm_package() -> Path:
    """The installed vLLM package's folder (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ScopeError("vLLM is not installed: the scope is what its checks run of it")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def measure_here(out: Path, suites: tuple[str, ...]) -> int:
    """Run the suites under coverage in this process and write the table to ``out``; the exit
    status (2: pytest could not run them)."""
    import coverage

    from harness.mutation.reach_measure import run_under_coverage

    os.chdir(ROOT)
    started = time.perf_counter()
    package = vllm_package()
    cov = coverage.Coverage(data_file=None, include=[f"{package}/*"], branch=False)
    status, contexts = run_under_coverage(cov, suites)
    if status not in (0, 1):  # 1: a check failed, which the scope does not depend on
        print(f"nemotron-vl-scope: pytest exited {status}", file=sys.stderr)
        return 2
    checks = sorted(contexts.seconds)
    index = {check: i for i, check in enumerate(checks)}
    data = cov.get_data()
    files: dict[str, dict[str, FunctionReach]] = {}
    for measured in sorted(data.measured_files()):
        path = Path(measured).resolve()
        if package not in path.parents or path.suffix != ".py":
            continue
        lines = attribute_lines(data.contexts_by_lineno(measured) or {}, index, contexts.users)
        if not lines:
            continue  # run at import alone
        functions = list(functions_of(path.read_text()))
        reached: dict[str, set[int]] = {}
        for line, by in lines.items():
            name = innermost_function(functions, line)
            if name is not None:
                reached.setdefault(name, set()).update(by)
        if not reached:
            continue  # module-level lines only
        spans = {name: (first, last) for name, first, last in functions}
        relative = path.relative_to(package.parent).as_posix()
        files[relative] = {
            name: FunctionReach(*spans[name], frozenset(by)) for name, by in reached.items()
        }
    scope = Scope(
        vllm_version=metadata.version("vllm"),
        checks=checks,
        files=files,
        meta={
            "command": REFRESH,
            "suites": list(suites),
            "measured_on": datetime.date.today().isoformat(),
            "wall_s": round(time.perf_counter() - started, 1),
            "builds": len(contexts.builds),
            "coverage": coverage.__version__,
        },
    )
    replace_text(out, json.dumps(scope.to_json(), indent=0, sort_keys=False) + "\n")
    return 0


def measure(out: Path, suites: tuple[str, ...]) -> Scope:
    """Measure in a new process (it builds models) and read the table it writes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "harness.mutation.scope", "--in-this-process"]
    command += ["--out", str(out), "--suites", *suites]
    print(f"[scope] measuring what the checks run of vLLM: {' '.join(command)}", flush=True)
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **MEASURING_ENV}, check=False)
    if done.returncode != 0:
        raise ScopeError(f"measuring the scope failed (exit status {done.returncode}); see above")
    return read_scope(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-scope", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: the table's own file")
    parser.add_argument("--suites", nargs="+", default=list(SUITES), metavar="PATH")
    parser.add_argument(
        "--engine",
        action="store_true",
        help="the engine leg's scope: the engine and server suites on the CPU build, every "
        "process of vLLM measured (harness.mutation.scope_engine)",
    )
    parser.add_argument("--in-this-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    out: Path = args.out or (ENGINE_SCOPE_FILE if args.engine else SCOPE_FILE)
    if args.in_this_process:
        os.environ.update(MEASURING_ENV)  # before torch is imported: it reads it once
        return measure_here(out.resolve(), tuple(args.suites))
    started = time.perf_counter()
    try:
        if args.engine:
            from harness.mutation.scope_engine import measure_engine

            scope = measure_engine(out.resolve())
        else:
            scope = measure(out, tuple(args.suites))
    except ScopeError as e:
        print(f"nemotron-vl-scope: error: {e}", file=sys.stderr)
        return 2
    counts = summary(scope)
    print(
        f"[scope] vLLM {scope.vllm_version}: {counts['functions']} functions in "
        f"{counts['files']} files run by {counts['checks']} checks "
        f"({time.perf_counter() - started:.0f} s): {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
