"""Many suite runs from one process: vLLM and the suites imported once, each run in a fork.

Importing vLLM takes about 10 s on a 2-core machine, longer than most mutants' checks. The runner
imports it (and torch, pytest, the harness) once in the parent; each run is a forked child that
loads its own target (a ``vllm-file:`` mutant replaces modules in the child's copy of
``sys.modules`` only), runs ``pytest.main`` with ``--results-json``, and exits. The parent reads
the results file. Children use one torch thread each and run ``parallel`` at a time; a child that
passes its time limit is killed with its process group and the run says so.

Forking is safe here because the parent only imports: it starts no torch thread pool of its own
before forking (children that inherit a used OpenMP pool can hang in their first parallel
region, hence one thread per child).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT
from harness.jobs.preload import fork_frozen, output_to, preload_target_imports
from harness.jobs.results import CheckResult, ResultsError, TargetResults, read_results

#: Seconds one run (a whole selection) may take: the slowest mutant's selection takes about a
#: minute on a 2-core machine; a mutant that loops must not stall the matrix.
DEFAULT_RUN_TIMEOUT_S = 600.0
POLL_S = 0.05
OUTPUT_TAIL_CHARS = 4000


@dataclass(frozen=True)
class SuiteJob:
    """One ``pytest SUITES --target=TARGET`` run; its files go to ``workdir``. With no
    ``target``, ``extra_args`` choose it (or the default, ``reference``)."""

    key: str
    target: str | None
    suites: tuple[str, ...]
    workdir: Path
    extra_args: tuple[str, ...] = ()
    #: this run's time limit in seconds (None: ``run_many``'s)
    timeout_s: float | None = None

    @property
    def results_path(self) -> Path:
        return self.workdir / "results.json"

    @property
    def log_path(self) -> Path:
        return self.workdir / "output.log"

    def pytest_args(self) -> list[str]:
        return [
            *self.suites,
            *([f"--target={self.target}"] if self.target is not None else []),
            f"--results-json={self.results_path}",
            "-p",
            "no:cacheprovider",
            "-q",
            "--tb=native",  # pytest's long tracebacks parse each frame's whole source file
            # Its collections of the garbage at exit: 1.5 s of a child's 4.5 s on a quick check.
            "-p",
            "no:unraisableexception",
            # The parent imported the plugin and the suites before pytest.main could rewrite them.
            "-W",
            "ignore::pytest.PytestAssertRewriteWarning",
            *self.extra_args,
        ]


@dataclass
class SuiteRun:
    """What one run left: its exit status, output, per-check results and wall time."""

    key: str
    returncode: int
    output: str
    results: TargetResults | None
    wall_s: float = 0.0
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def checks(self) -> list[CheckResult]:
        return [] if self.results is None else list(self.results["checks"])

    def outcome(self, check: str) -> CheckResult:
        assert self.results is not None, f"no results written; output:\n{self.output[-3000:]}"
        for entry in self.results["checks"]:
            if entry["id"] == check:
                return entry
        raise AssertionError(f"check {check!r} not in the results of {self.key}")

    def outcomes(self, value: str) -> set[str]:
        assert self.results is not None, f"no results written; output:\n{self.output[-3000:]}"
        return {c["id"] for c in self.results["checks"] if c["outcome"] == value}


def preload(*, vllm: bool) -> None:
    """Import what every run would otherwise import again (:func:`preload_target_imports`),
    the harness's plugin and hypothesis included (measured: 2.6 s of a 3 s child session that
    runs one quick check)."""
    from harness.plugin import PLUGINS

    preload_target_imports(vllm=vllm, modules=("hypothesis", "harness.plugin", *PLUGINS))


def _child(job: SuiteJob) -> None:
    """The forked child: run the job's pytest session and exit with its status, never return."""
    status = 3
    try:
        os.setsid()  # its own process group: a timeout kills whatever it started
        job.workdir.mkdir(parents=True, exist_ok=True)
        output_to(os.open(job.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        os.chdir(ROOT)
        import pytest
        import torch

        from harness.checkpoints.cache import write_new_folders_under

        torch.set_num_threads(1)
        # os._exit skips exit handlers: the child's checkpoint folders go where it removes them.
        write_new_folders_under(job.workdir / "checkpoints")
        status = int(pytest.main(job.pytest_args()))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        shutil.rmtree(job.workdir / "checkpoints", ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _finish(job: SuiteJob, wait_status: int, wall_s: float, timed_out: bool) -> SuiteRun:
    problems: list[str] = []
    output = job.log_path.read_text(errors="replace") if job.log_path.is_file() else ""
    results: TargetResults | None = None
    if job.results_path.is_file():
        try:
            results = read_results(job.results_path)
        except ResultsError as e:
            problems.append(str(e))
    returncode = os.waitstatus_to_exitcode(wait_status)
    if timed_out:
        problems.append(f"killed after its time limit of {wall_s:.0f} s")
    elif returncode < 0:
        problems.append(f"died of signal {signal.Signals(-returncode).name}")
    return SuiteRun(
        key=job.key,
        returncode=returncode,
        output=output[-OUTPUT_TAIL_CHARS:],
        results=results,
        wall_s=round(wall_s, 2),
        timed_out=timed_out,
        problems=problems,
    )


def run_many(
    jobs: Sequence[SuiteJob],
    *,
    parallel: int = 1,
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
) -> Iterator[SuiteRun]:
    """Run ``jobs``, ``parallel`` at a time, each in a fork of this process; yield each run as
    it ends (not in job order). Call :func:`preload` first, or each child imports vLLM itself."""
    if parallel < 1:
        raise ValueError(f"parallel: expected a positive number of children, got {parallel}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s}")
    pending = list(reversed(jobs))
    running: dict[int, tuple[SuiteJob, float]] = {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop()
                pid = fork_frozen()
                if pid == 0:
                    _child(job)
                running[pid] = (job, time.monotonic())
            time.sleep(POLL_S)
            for pid, (job, started) in list(running.items()):
                done, wait_status = os.waitpid(pid, os.WNOHANG)
                elapsed = time.monotonic() - started
                timed_out = False
                if done == 0:
                    if elapsed < (job.timeout_s or timeout_s):
                        continue
                    _kill_group(pid)
                    _, wait_status = os.waitpid(pid, 0)
                    timed_out = True
                del running[pid]
                yield _finish(job, wait_status, elapsed, timed_out)
    finally:
        for pid in running:  # interrupted: leave no child behind
            _kill_group(pid)
            os.waitpid(pid, 0)


def run_one(job: SuiteJob, *, timeout_s: float = DEFAULT_RUN_TIMEOUT_S) -> SuiteRun:
    return next(run_many([job], timeout_s=timeout_s))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
