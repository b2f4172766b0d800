"""The test run's time budget (``fixtures/test_budget.toml``), read against the JUnit files a run
wrote: each stream's time, and each test module's, against its share.

A stream is a fixed sequence of pytest runs (``nox -s tests`` runs two side by side; ``nox -s
tests-slow`` one), each writing one JUnit file under ``reports/``. A module's time is the sum of
its test cases' (setup, call and teardown: pytest's default), so a module-scoped fixture that
runs main jobs counts against the module that asked for it; a stream's time is the sum of its
runs' session times (collection and start-up included), which is its wall time.

The budget is written in seconds on the machine the project's CI runs on (2 cores with AVX-512)
and multiplied by the family's slowdown for a machine of another CPU family
(:mod:`harness.machine`): torch's bf16 kernels, which much of the run computes with, are several
times slower without AVX-512. Standard library only: ``nox`` and the test of the timings read it
without torch.
"""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import ROOT

BUDGET_FILE = ROOT / "fixtures" / "test_budget.toml"


class BudgetError(ValueError):
    """A budget file that cannot be read: the message names the field, the expected and the
    actual value."""


@dataclass(frozen=True)
class Stream:
    """One stream's budget: its JUnit files, its seconds, its modules' shares."""

    name: str
    runs: tuple[str, ...]
    budget_s: float
    default_share_s: float
    shares: dict[str, float]

    def share_of(self, module: str) -> float:
        return self.shares.get(module, self.default_share_s)


@dataclass(frozen=True)
class Budget:
    """The whole budget: the streams of each session, the slowdown per CPU family, and what the
    budget promises on the slowest machine (a fresh clone's run, environments included, and a
    run that reuses them)."""

    streams: dict[str, Stream]
    sessions: dict[str, tuple[str, ...]]
    slowdown: dict[str, float]
    environments_s: float
    fresh_clone_s: float
    reused_s: float

    def factor(self, family: str) -> float:
        if family not in self.slowdown:
            raise BudgetError(
                f"slowdown: expected one of {sorted(self.slowdown)}, got the family {family!r}"
            )
        return self.slowdown[family]

    def session_s(self, session: str, family: str) -> float:
        """The slowest stream of ``session`` on a ``family`` machine: the session's wall time
        with its environments reused."""
        return max(self.streams[name].budget_s for name in self.sessions[session]) * self.factor(
            family
        )


def _number(table: dict[str, Any], key: str, where: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise BudgetError(f"{where}.{key}: expected a positive number of seconds, got {value!r}")
    return float(value)


def _table(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise BudgetError(f"{where}{key}: expected a table, got {value!r}")
    return value


def load_budget(path: Path = BUDGET_FILE) -> Budget:
    """The budget in ``path``; :class:`BudgetError` naming the field where it is malformed."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BudgetError(f"{path}: not TOML: {e}") from None
    slowdown = {
        family: _number(_table(data, "slowdown", ""), family, "slowdown")
        for family in _table(data, "slowdown", "")
    }
    promise = _table(data, "promise", "")
    streams: dict[str, Stream] = {}
    for name, table in _table(data, "stream", "").items():
        where = f"stream.{name}"
        runs = table.get("runs")
        if not isinstance(runs, list) or not runs or not all(isinstance(r, str) for r in runs):
            raise BudgetError(f"{where}.runs: expected a list of JUnit file names, got {runs!r}")
        shares = table.get("shares", {})
        if not isinstance(shares, dict):
            raise BudgetError(f"{where}.shares: expected a table, got {shares!r}")
        streams[name] = Stream(
            name,
            tuple(runs),
            _number(table, "budget_s", where),
            _number(table, "default_share_s", where),
            {module: _number(shares, module, f"{where}.shares") for module in shares},
        )
    sessions: dict[str, tuple[str, ...]] = {}
    for session, names in _table(data, "session", "").items():
        if not isinstance(names, list) or not names or not set(names) <= set(streams):
            raise BudgetError(
                f"session.{session}: expected a list of streams among {sorted(streams)}, "
                f"got {names!r}"
            )
        sessions[session] = tuple(names)
    return Budget(
        streams,
        sessions,
        slowdown,
        _number(promise, "environments_s", "promise"),
        _number(promise, "fresh_clone_s", "promise"),
        _number(promise, "reused_s", "promise"),
    )


def module_of(classname: str) -> str:
    """The test module of a JUnit test case's class name (``suites.harness.test_gate`` of
    ``suites.harness.test_gate`` and of ``suites.reference.test_audio.TestParityWithVllm``)."""
    parts = classname.split(".")
    for index, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[: index + 1])
    return classname


@dataclass(frozen=True)
class RunTimes:
    """What one JUnit file says: its session's seconds and each module's."""

    file: str
    session_s: float
    modules: dict[str, float]


def read_junit(path: Path) -> RunTimes:
    """The times in the JUnit file at ``path``; :class:`BudgetError` where it is not one."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise BudgetError(f"{path}: expected a JUnit XML file: {e}") from None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    if not suites:
        raise BudgetError(f"{path}: expected a <testsuite> element, found none")
    modules: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        modules[module_of(case.get("classname", ""))] += float(case.get("time", 0))
    return RunTimes(path.name, sum(float(s.get("time", 0)) for s in suites), dict(modules))


def _together(times: list[RunTimes]) -> list[tuple[str, float]]:
    """Each module's seconds over ``times``, the slowest first."""
    modules: dict[str, float] = defaultdict(float)
    for t in times:
        for module, seconds in t.modules.items():
            modules[module] += seconds
    return sorted(modules.items(), key=lambda item: -item[1])


@dataclass(frozen=True)
class Overrun:
    """A stream or a module past its share on this machine."""

    what: str
    took_s: float
    allowed_s: float

    def __str__(self) -> str:
        return f"{self.what}: {self.took_s:.0f} s, past its {self.allowed_s:.0f} s"


#: The session whose streams a check of the timings reads (``tests``, ``tests-slow``; unset:
#: every stream's files found), set by nox for the check it runs after a session's streams.
SESSION_ENV = "NEMOTRON_VL_TIMINGS_SESSION"


def streams_of(budget: Budget, session: str | None) -> list[Stream]:
    """The streams of ``session`` (every stream for ``None``)."""
    if session is None:
        return list(budget.streams.values())
    if session not in budget.sessions:
        raise BudgetError(
            f"{SESSION_ENV}: expected one of {sorted(budget.sessions)}, got {session!r}"
        )
    return [budget.streams[name] for name in budget.sessions[session]]


def overruns(
    budget: Budget, folder: Path, family: str, session: str | None = None
) -> tuple[list[Overrun], list[str]]:
    """Each stream of ``session`` whose JUnit files under ``folder`` took longer than its
    budget, and each module past its share, both scaled to a ``family`` machine; and the JUnit
    files read."""
    factor = budget.factor(family)
    found: list[Overrun] = []
    read: list[str] = []
    for stream in streams_of(budget, session):
        times = [read_junit(folder / run) for run in stream.runs if (folder / run).is_file()]
        if not times:
            continue
        read += [t.file for t in times]
        took = sum(t.session_s for t in times)
        if took > stream.budget_s * factor:
            found.append(Overrun(f"stream {stream.name!r}", took, stream.budget_s * factor))
        for module, seconds in _together(times):
            allowed = stream.share_of(module) * factor
            if seconds > allowed:
                found.append(Overrun(f"{module} (stream {stream.name!r})", seconds, allowed))
    return found, read


def stream_times(
    budget: Budget, folder: Path, session: str | None = None
) -> list[tuple[str, float, float]]:
    """Each stream of ``session`` whose JUnit files lie under ``folder``: its name, its seconds
    and its budget's (on the machine the budget is written for)."""
    found = []
    for stream in streams_of(budget, session):
        times = [read_junit(folder / run) for run in stream.runs if (folder / run).is_file()]
        if times:
            found.append((stream.name, round(sum(t.session_s for t in times), 1), stream.budget_s))
    return found


def slowest_modules(folder: Path, files: list[str], count: int = 10) -> list[tuple[str, float]]:
    """The ``count`` slowest modules over the JUnit ``files`` under ``folder``."""
    together = _together([read_junit(folder / name) for name in files])
    return [(module, round(seconds, 1)) for module, seconds in together[:count]]
