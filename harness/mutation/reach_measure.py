"""The measuring process of :mod:`harness.mutation.reach`: the suites under coverage.py.

Run as ``nemotron-vl-reach --in-this-process`` by :func:`harness.mutation.reach.measure`.

One coverage context per check (its set-up, call and teardown), one per model build; a build's
lines count for every check that asked for that build. The scope's functools caches are emptied
as each check starts, so that a cached function's lines count for every check that calls it.
Run in a process of its own: it builds models, which the mutation runner's process must not hold
before it forks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import coverage
import pytest
from coverage.python import PythonFileReporter

from harness import ROOT
from harness.jobs.results import replace_text
from harness.model_files import installed_file, module_of
from harness.mutation.reach import BUILD, SCOPE, SUITES, Reach, attribute_lines, fingerprint
from harness.plugin.builds import patch_builds


class Contexts:
    """Switches coverage's context as checks start and builds run; records who used which
    build and how long each check took."""

    def __init__(
        self, cov: coverage.Coverage, clear_caches: Callable[[], object] = lambda: None
    ) -> None:
        self.cov = cov
        self.clear_caches = clear_caches
        self.check = ""
        self.started = 0.0
        self.seconds: dict[str, float] = {}
        self.builds: dict[str, int] = {}  # build key -> its index
        self.users: dict[int, set[str]] = {}  # build index -> the checks that asked for it
        self.stack: list[str] = []

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.clear_caches()
        self.check, self.started = nodeid, time.perf_counter()
        self.cov.switch_context(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.seconds[nodeid] = round(time.perf_counter() - self.started, 3)
        self.check = ""
        self.cov.switch_context("")

    def around_build(self, key: str, spec: object, build: Callable[[], Any]) -> Any:
        index = self.builds.setdefault(key, len(self.builds))
        if self.check:
            self.users.setdefault(index, set()).add(self.check)
        self.stack.append(f"{BUILD}{index}")
        self.cov.switch_context(self.stack[-1])
        try:
            return build()
        finally:
            self.stack.pop()
            self.cov.switch_context(self.stack[-1] if self.stack else self.check)


def clear_caches_of(modules: Collection[str]) -> int:
    """Empty every functools cache (``@cache``, ``@lru_cache``) of a function defined in one of
    ``modules`` (those imported so far), at module level or in a class; the number emptied.

    Called as each check starts: a cached function's body then runs in every check that calls
    it, not only in the first one of the process, and its lines are each such check's. (Parakeet's
    mel filters and window are cached: measured without this, one check of 55 that use them was
    credited, and their mutants ran against that one alone.)"""
    emptied = 0
    for name in modules:
        module = sys.modules.get(name)
        if module is None:
            continue  # not imported yet: nothing of it is cached
        for value in list(vars(module).values()):
            members = list(vars(value).values()) if isinstance(value, type) else []
            for candidate in (value, *members):
                function = getattr(candidate, "__func__", candidate)  # staticmethod, classmethod
                clear = getattr(function, "cache_clear", None)
                wrapped = getattr(function, "__wrapped__", None)
                if callable(clear) and getattr(wrapped, "__module__", None) == name:
                    clear()
                    emptied += 1
    return emptied


def with_first_lines(
    contexts_by_line: Mapping[int, Collection[str]], reporter: PythonFileReporter
) -> dict[int, set[str]]:
    """The traced lines' contexts, each also credited to the first line of its statement.

    The tracer records the lines Python runs, and Python 3.11 runs a multi-line condition
    (``if (\n a\n and b\n):``) on its lower lines only, while coverage.py names the statement by
    its first line: without this, that first line looked unreached though the statement ran
    (and a mutant of it counted as a survivor with no run). The lower lines stay, for mutants
    that sit on them."""
    out: dict[int, set[str]] = {}
    for line, names in contexts_by_line.items():
        for target in {line} | reporter.translate_lines([line]):
            out.setdefault(target, set()).update(names)
    return out


def run_under_coverage(cov: coverage.Coverage, suites: tuple[str, ...]) -> tuple[int, Contexts]:
    """``suites`` against the installed vLLM (``--target=vllm``) in this process under
    ``cov``, a context per check and per build (the model files' functools caches emptied as
    each check starts): pytest's exit status and the contexts' record."""
    modules = [module_of(entry.file) for entry in SCOPE]
    contexts = Contexts(cov, clear_caches=lambda: clear_caches_of(modules))
    cov.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch_builds(contexts.around_build, patch)
            status = pytest.main(
                [*suites, "--target=vllm", "-p", "no:cacheprovider", "-q", "--no-header"],
                plugins=[contexts],
            )
    finally:
        cov.stop()
    return int(status), contexts


def measure_here(out: Path, suites: tuple[str, ...] = SUITES) -> int:
    """Run the suites under coverage in this process and write the map to ``out``; the exit
    status (2: pytest could not run them)."""
    os.chdir(ROOT)
    started = time.perf_counter()
    files = {str(installed_file(entry.file)): str(entry.file) for entry in SCOPE}
    cov = coverage.Coverage(data_file=None, include=list(files), branch=False)
    status, contexts = run_under_coverage(cov, suites)
    if status not in (0, 1):  # 1: a check failed, which a reach map does not depend on
        print(f"reach_measure: pytest exited {status}", file=sys.stderr)
        return 2
    checks = sorted(contexts.seconds)
    index = {check: i for i, check in enumerate(checks)}
    data = cov.get_data()
    lines: dict[str, dict[int, list[int]]] = {}
    executable: dict[str, list[int]] = {}
    for path, relative in files.items():
        lines[relative] = attribute_lines(
            with_first_lines(data.contexts_by_lineno(path) or {}, PythonFileReporter(path, cov)),
            index,
            contexts.users,
        )
        executable[relative] = sorted(cov.analysis2(path)[1])
    reach = Reach(
        fingerprint=fingerprint(suites),
        checks=checks,
        seconds=[contexts.seconds[c] for c in checks],
        lines=lines,
        executable=executable,
        wall_s=round(time.perf_counter() - started, 1),
        meta={
            "command": "nemotron-vl-reach",
            "suites": list(suites),
            "builds": len(contexts.builds),
            "coverage": coverage.__version__,
        },
    )
    replace_text(out, json.dumps(reach.to_json()) + "\n")
    return 0
