"""torch's thread count during a run: following the main job's share of the cores, or a schedule.

``--core-share-file PATH``: the main job writes the number of cores each of its running
processes may use to one file (:class:`harness.jobs.cores.CoreShare`); before each check, this
process reads it and, when it changed, sets torch's intra-op thread count to it.

``--thread-schedule N,M,...``: the k-th check runs at the ``k mod len``-th count of the list
(``2,1``: the count changes before every check). The flake hunt (:mod:`harness.jobs.flakes`)
uses it to prove that no check's outcome depends on the thread count it runs at, or on the
count an earlier check ran at (:mod:`harness.numerics`). Without either option, nothing changes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from harness.jobs.cores import read_share


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemotron-vl")
    group.addoption(
        "--core-share-file",
        default=None,
        metavar="PATH",
        help="the main job's file holding this process's share of the cores (torch's threads)",
    )
    group.addoption(
        "--thread-schedule",
        default=None,
        metavar="N,M,...",
        help="torch's thread count per check, in turn (2,1: another count before every check)",
    )


def parse_schedule(text: str) -> tuple[int, ...]:
    """``"2,1"`` -> ``(2, 1)``; a clear error naming the option for anything but positive
    integers separated by commas."""
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"[1-9][0-9]*", part) for part in parts):
        raise pytest.UsageError(
            f"--thread-schedule: expected positive thread counts separated by commas "
            f"(e.g. 2,1), got {text!r}"
        )
    return tuple(int(part) for part in parts)


class ThreadsFollowShare:
    """Before each check, torch's thread count set to the share in the main job's file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied: int | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        share = read_share(self.path)
        torch = sys.modules.get("torch")  # a check that has not imported torch needs no threads
        if share is None or share == self.applied or torch is None:
            return
        torch.set_num_threads(share)
        self.applied = share


class ThreadsFollowSchedule:
    """Before the k-th check, torch's thread count set to the schedule's ``k mod len``-th."""

    def __init__(self, schedule: tuple[int, ...]) -> None:
        self.schedule = schedule
        self.checks = 0

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        import torch  # a schedule is for checks that compute: the first may not have loaded it

        count = self.schedule[self.checks % len(self.schedule)]
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        self.checks += 1


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--core-share-file")
    schedule = config.getoption("--thread-schedule")
    if path and schedule:
        raise pytest.UsageError(
            "--thread-schedule and --core-share-file both set torch's threads: give one"
        )
    if path:
        config.pluginmanager.register(ThreadsFollowShare(Path(path)), "nemotron-vl-cores")
    elif schedule:
        plugin = ThreadsFollowSchedule(parse_schedule(str(schedule)))
        config.pluginmanager.register(plugin, "nemotron-vl-cores")
