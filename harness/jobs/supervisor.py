"""Fault isolation: one target's pytest process, watched from outside.

A fault in the implementation under test must fail a check, never stall, pass or take down the
run. The main job therefore runs each target's suites in a child process (its own session, so the
whole process group can be killed) and watches it:

- **time**: each check has a limit (``--check-timeout``); the stretches between checks (start-up,
  collection, session teardown) have the same one. A check past it is killed with its process (a
  loop in compiled code cannot be interrupted from within), a FAIL naming the check and the
  limit, and the suites restart from the next check (``--resume``).
- **memory**: the resident memory of the process group is sampled; over ``--memory-limit`` the
  group is killed, the running check FAILs, and the suites restart from the next check.
- **crashes**: a process that dies before its session ends (a signal, ``os._exit(0)``) keeps the
  results it wrote (the plugin writes after every check); the running check is an ERROR, the
  target is "crashed", and the suites restart from the next check.
- **interruption**: Ctrl-C or SIGTERM kills the process group; the report is still written from
  what finished.

Every restart must make progress (a check recorded), and at most ``max_restarts`` happen per
target; after that the checks left are not run and the target is "incomplete".

The supervisor never writes a check's result: the plugin is the one writer
(:mod:`harness.plugin.results`). A check a fault stopped is handed to the next pytest process
(``--stopped-checks FILE``), which records it with what it runs on and its serving configuration
before running the rest; after the last restart, a process records the stopped checks alone
(``--record-stopped-only``).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from harness.jobs.forkserver import ForkedProcess, ForkServer, ForkServerError
from harness.jobs.processes import (
    KILL_GRACE_S,
    TargetProcess,
    group_memory_bytes,
    how_it_ended,
    kill_group,
)
from harness.jobs.results import (
    STARTED_AT_ENV,
    Incident,
    IncidentKind,
    Outcome,
    ResultsError,
    StoppedCheck,
    TargetResults,
    read_results,
    write_stopped_checks,
)
from harness.jobs.stacks import stack_file, where

#: Seconds per check, its set-up included. Measured on a 2-core CPU machine with both targets
#: side by side: the slowest honest check takes up to 15 s (a module's first check builds its
#: models); the typing checks' mypy run takes 99 s on a cold cache (the shared environment warms
#: the cache when it is built, so a nox run never pays it). 180 s is 1.8 times that cold run.
DEFAULT_CHECK_TIMEOUT_S = 180.0
#: Resident memory of a target's process group, in GiB. A whole honest run peaks at 8.0 GiB
#: (vLLM: each process keeps every variant it built, the covering array's and the weight
#: checks' among them) and 5.6 GiB (reference), measured the same way on the 2-core machine;
#: 12 GiB leaves a runaway check the rest of a 23 GiB machine's memory to be caught in.
DEFAULT_MEMORY_LIMIT_GIB = 12.0
DEFAULT_MAX_RESTARTS = 5
#: After a check times out, the target's other checks run under a limit derived from this run's
#: honest checks: this many times the slowest seen so far (its set-up included; the default of
#: ``--derived-limit-factor``), never below :data:`DERIVED_LIMIT_FLOOR_S` nor above
#: ``--check-timeout``. A fault on a path many checks share (a parser that loops) then costs one
#: full limit and a short one per check after it. A check past the derived limit is killed only
#: where a check that timed out was stuck (harness/jobs/stacks.py); one elsewhere is an honest
#: slow check and keeps the full limit (on a loaded CI machine, honest checks of restarted
#: processes once went past the 30 s floor and were killed).
DEFAULT_DERIVED_LIMIT_FACTOR = 2.5
#: The floor stands for the first check of a restarted process, which builds its models again
#: (measured: 10 to 15 s on a loaded 2-core machine; a floor of 15 s killed such a check).
DERIVED_LIMIT_FLOOR_S = 30.0
POLL_S = 0.05
TAIL_LINES = 40
#: Whether a process group's memory can be read (Linux ``/proc``); elsewhere the limit is off.
MEMORY_VISIBLE = os.path.exists("/proc/self/statm")
#: pytest's exit statuses for a run it stopped or refused (interrupted, internal error, usage).
PYTEST_REFUSED = (2, 3, 4)


@dataclass(frozen=True)
class Limits:
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    memory_limit_gib: float = DEFAULT_MEMORY_LIMIT_GIB
    max_restarts: int = DEFAULT_MAX_RESTARTS
    derived_limit_factor: float = DEFAULT_DERIVED_LIMIT_FACTOR
    derived_limit_floor_s: float = DERIVED_LIMIT_FLOOR_S

    def __post_init__(self) -> None:
        for name, value, low in (
            ("check_timeout_s", self.check_timeout_s, 0.0),
            ("memory_limit_gib", self.memory_limit_gib, 0.0),
            ("derived_limit_factor", self.derived_limit_factor, 0.0),
            ("derived_limit_floor_s", self.derived_limit_floor_s, 0.0),
        ):
            if not value > low:
                raise ValueError(f"Limits.{name}: expected a number > {low:g}, got {value!r}")
        if self.max_restarts < 0:
            raise ValueError(
                f"Limits.max_restarts: expected an integer >= 0, got {self.max_restarts!r}"
            )


@dataclass
class Supervised:
    """What happened to one target's process(es)."""

    exit_status: int  # the last process's: pytest's status, or -N for a signal
    incidents: list[Incident] = field(default_factory=list)
    restarts: int = 0
    peak_memory_gib: float = 0.0
    slowest_check: tuple[str, float] | None = None  # (check id, seconds) as the supervisor saw
    #: the limit of each check after the first timeout (None: no check timed out)
    derived_check_timeout_s: float | None = None
    wall_s: float = 0.0  # from the first start to the last process's end
    forked: int = 0  # processes forked from a fork server
    started_new: int = 0  # processes started as a new Python
    #: the checks that went past the derived limit where no check that timed out was stuck, and
    #: kept the full limit (each: its id, where it was, after how long)
    past_derived_limit: list[str] = field(default_factory=list)
    output_tail: list[str] = field(default_factory=list)  # the last process's last lines

    @property
    def last_words(self) -> str:
        """What the last process said before it ended: its "harness could not run" line when it
        printed one, else its last lines."""
        for line in reversed(self.output_tail):
            if "harness could not run:" in line:
                return line[line.index("harness could not run:") :].strip(" !")
        return " / ".join(line.strip() for line in self.output_tail[-5:] if line.strip())


class Interrupt:
    """SIGINT and SIGTERM set a flag the supervisor polls, so that it can still kill the target
    and write the report (the default handlers would end the main job mid-write)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __bool__(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    @contextmanager
    def installed(self) -> Iterator[Interrupt]:
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _echo(proc: TargetProcess, tail: collections.deque[str], label: str) -> None:
    """Copy the child's output to ours as it comes (each line after ``label`` when two targets
    run at once), keeping its last lines for the report."""
    assert proc.stdout is not None
    out = sys.stdout.buffer
    prefix = f"[{label}] ".encode() if label else b""
    for raw in iter(proc.stdout.readline, b""):
        out.write(prefix + raw)
        out.flush()
        tail.append(raw.decode(errors="replace").rstrip("\n"))


def _read_progress(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass
class _Watch:
    """One child process's life as the supervisor saw it."""

    returncode: int
    incident: Incident | None = None


class Supervisor:
    """Runs ``command(resume)`` until the suites finish, restarting after each fault."""

    def __init__(
        self,
        command: Callable[[bool], Sequence[str]],
        *,
        results: Path,
        progress: Path,
        limits: Limits,
        cwd: Path,
        interrupt: Interrupt,
        label: str = "",
        fork_server: ForkServer | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.label = label
        #: what its processes get besides this process's environment
        self.env = dict(env or {})
        #: where its processes are forked from (None: each a new Python)
        self.fork_server = fork_server
        self.command = command
        self.results = results
        self.progress = progress
        self.limits = limits
        self.cwd = cwd
        self.interrupt = interrupt
        self.started = 0.0
        self.outcome = Supervised(exit_status=0)
        #: the slowest honest check's seconds when the derived limit was last set
        self.derived_from_s = 0.0
        #: the checks faults stopped, for the next process to record
        self.stopped: list[StoppedCheck] = []
        self.stopped_file = progress.with_name(progress.name + ".stopped.json")
        #: the functions the checks that timed out were stuck in (:mod:`harness.jobs.stacks`)
        self.hang_places: set[tuple[str, str]] = set()
        #: the checks past the derived limit elsewhere, which keep the full limit
        self.full_limit: set[str] = set()

    def run(self) -> Supervised:
        try:
            return self._run()
        finally:
            self.stopped_file.unlink(missing_ok=True)
            stack_file(self.progress).unlink(missing_ok=True)

    def _run(self) -> Supervised:
        self.started = time.monotonic()
        if not MEMORY_VISIBLE:
            print(
                "harness.jobs.supervisor: no /proc on this system: the memory limit is not "
                "enforced",
                file=sys.stderr,
                flush=True,
            )
        resume = False
        while True:
            done_before = self._checks_done()
            watch = self._watch(resume)
            self.outcome.exit_status = watch.returncode
            self.outcome.wall_s = self._elapsed()
            if watch.incident is None:
                return self.outcome  # the session ended by itself
            self.outcome.incidents.append(watch.incident)
            if watch.incident["kind"] == IncidentKind.INTERRUPTED:
                return self.outcome
            if watch.incident["kind"] == IncidentKind.TIMEOUT:
                self._derive_check_limit()
            if watch.incident["check"] is not None:
                self._record(watch.incident)
            if self._checks_done() <= done_before:
                self._record_stopped_only()
                return self.outcome  # no progress: a restart would fail the same way
            if self.outcome.restarts >= self.limits.max_restarts:
                self._give_up()
                self._record_stopped_only()
                return self.outcome
            self.outcome.restarts += 1
            resume = True

    def _derive_check_limit(self) -> None:
        """The limit of the checks after a timeout (:data:`DERIVED_LIMIT_FACTOR`)."""
        slowest = self.outcome.slowest_check[1] if self.outcome.slowest_check else 0.0
        derived = max(self.limits.derived_limit_floor_s, self.limits.derived_limit_factor * slowest)
        self.derived_from_s = slowest
        self.outcome.derived_check_timeout_s = round(min(self.limits.check_timeout_s, derived), 2)

    def _limit_of(self, running: str) -> float:
        """The time limit of what is running now: a check after a timeout has the derived
        limit (unless it went past it elsewhere, :meth:`_timeout`); start-up, collection and
        teardown keep ``--check-timeout``."""
        derived = self.outcome.derived_check_timeout_s
        if not running or derived is None or running in self.full_limit:
            return self.limits.check_timeout_s
        return derived

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def _written(self) -> TargetResults | None:
        """The results the target's processes wrote so far; None before the first write."""
        try:
            return read_results(self.results)
        except (OSError, ResultsError):
            return None

    def _checks_done(self) -> int:
        """Checks recorded, or stopped and to be recorded by the next process."""
        results = self._written()
        done = {check["id"] for check in results["checks"]} if results else set()
        return len(done | {check["id"] for check in self.stopped})

    def _command(self, resume: bool, record_only: bool = False) -> list[str]:
        command = list(self.command(resume))
        if self.stopped:
            command.append(f"--stopped-checks={self.stopped_file}")
        if record_only:
            command.append("--record-stopped-only")
        return command

    def _record_stopped_only(self) -> None:
        """Record the checks faults stopped when no process will run after them: one short
        process that records them (the plugin is the one writer of results) and runs none."""
        results = self._written()
        recorded = {check["id"] for check in results["checks"]} if results else set()
        if results is None or all(check["id"] in recorded for check in self.stopped):
            return
        proc = self._start(self._command(resume=True, record_only=True), quiet=True)
        try:
            returncode = proc.wait(timeout=self.limits.check_timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            returncode = proc.wait()
        if returncode not in (0, 5):  # 5: pytest ran no check, as asked
            names = ", ".join(check["id"] for check in self.stopped)
            print(
                f"harness.jobs.supervisor: the stopped checks were not recorded ({names}): "
                f"the process recording them {how_it_ended(returncode)}; the report's "
                "incidents name them",
                file=sys.stderr,
                flush=True,
            )

    def _watch(self, resume: bool) -> _Watch:
        self.progress.unlink(missing_ok=True)
        # A new process answers where its checks are once it has its own file (a dead one's
        # would have the signal sent to a process not yet answering it, which ends it).
        stack_file(self.progress).unlink(missing_ok=True)
        proc = self._start(self._command(resume))
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        echo = threading.Thread(target=_echo, args=(proc, tail, self.label), daemon=True)
        echo.start()
        try:
            return self._watch_process(proc)
        finally:
            echo.join(timeout=KILL_GRACE_S)
            self.outcome.output_tail = list(tail)

    def _interrupted(self) -> bool:
        return bool(self.interrupt)

    def _start(self, command: list[str], *, quiet: bool = False) -> TargetProcess:
        """``command`` in its own session: forked from the fork server when it is
        ``python -m pytest ...`` and a server is given, else a new process. Quiet, its output
        is dropped; else it is read from ``stdout``."""
        env = {**os.environ, **self.env, STARTED_AT_ENV: repr(time.time())}  # start-up timed
        if self.fork_server is not None and command[:3] == [sys.executable, "-m", "pytest"]:
            try:
                forked = self.fork_server.start(
                    command[3:], env, self.cwd, quiet=quiet, interrupted=self._interrupted
                )
                self.outcome.forked += 1
                return forked
            except ForkServerError as e:
                # Interrupted: the process started below is stopped at once, as it always was.
                if not self.interrupt:
                    print(
                        f"harness.jobs.supervisor: {e}; this target's processes start as new "
                        "processes from now on",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.fork_server = None
        output = subprocess.DEVNULL if quiet else subprocess.PIPE
        self.outcome.started_new += 1
        return subprocess.Popen(
            command,
            cwd=self.cwd,
            env=env,
            start_new_session=True,
            stdout=output,
            stderr=subprocess.DEVNULL if quiet else subprocess.STDOUT,
        )

    def _watch_process(self, proc: TargetProcess) -> _Watch:
        limit_bytes = self.limits.memory_limit_gib * 2**30
        running, since = "", time.monotonic()
        while True:
            returncode = proc.poll()
            now = time.monotonic()
            current = _read_progress(self.progress)
            if current != running:
                if running:
                    self._note_wall(running, now - since)
                running, since = current, now
            if returncode is not None:
                break
            if self.interrupt:
                kill_group(proc)
                name = signal.Signals(self.interrupt.signal or signal.SIGINT).name
                return _Watch(proc.wait(), self._incident(IncidentKind.INTERRUPTED, running, name))
            limit = self._limit_of(running)
            if now - since > limit:
                timeout = self._timeout(proc, running, limit, now - since)
                if timeout is not None:
                    return timeout
            used = group_memory_bytes(proc.pid)
            self.outcome.peak_memory_gib = max(self.outcome.peak_memory_gib, used / 2**30)
            if used > limit_bytes:
                kill_group(proc)
                detail = (
                    f"the target process group used {used / 2**30:.2f} GiB, over the memory "
                    f"limit of {self.limits.memory_limit_gib:g} GiB; it was killed"
                )
                return _Watch(proc.wait(), self._incident(IncidentKind.MEMORY, running, detail))
            time.sleep(POLL_S)
        if self._session_ended():
            return _Watch(returncode)
        if returncode in PYTEST_REFUSED and not self.results.is_file():
            return _Watch(returncode)  # pytest refused to start (an option, a plugin): no crash
        ended = how_it_ended(returncode)
        if isinstance(proc, ForkedProcess) and proc.server_lost:
            # Not the target's doing: its later processes start as new Pythons.
            ended = "its fork server ended, and the process was killed with it"
            self.fork_server = None
        return _Watch(returncode, self._incident(IncidentKind.CRASH, running, ended))

    def _timeout(
        self, proc: TargetProcess, running: str, limit: float, seconds: float
    ) -> _Watch | None:
        """The process's end for a check (or a stretch between checks) past its limit; None when
        the check is past the derived limit somewhere no check that timed out was stuck: an
        honest slow one (a loaded machine, a restarted process building its models again),
        which keeps the full limit."""
        # Asked only of a process still running (a forked one's pid is its own until reaped).
        site = where(proc.pid, self.progress) if running and proc.poll() is None else None
        derived = (
            bool(running)
            and self.outcome.derived_check_timeout_s is not None
            and self.outcome.derived_check_timeout_s < self.limits.check_timeout_s
            and running not in self.full_limit
        )
        if derived and site is not None and site.place not in self.hang_places:
            self.full_limit.add(running)
            self.outcome.past_derived_limit.append(
                f"{running}: at {site} after {seconds:.0f} s, kept the full limit"
            )
            return None
        kill_group(proc)
        which = "the derived check time limit" if derived else "the check time limit"
        limits = self.limits
        basis = (
            f" ({limits.derived_limit_factor:g} x the slowest honest check when a check timed "
            f"out, {self.derived_from_s:g} s; at least {limits.derived_limit_floor_s:g} s, at "
            f"most {limits.check_timeout_s:g} s)"
            if derived
            else ""
        )
        if site is None:
            stuck = ""
        elif derived:
            stuck = f"; stuck where a check that timed out was, {site}"
        else:
            stuck = f"; stuck at {site}"
        if site is not None:
            self.hang_places.add(site.place)
        detail = (
            f"exceeded {which} of {limit:g} s{basis}{stuck}; the target process was killed (a "
            "loop in compiled code cannot be interrupted from within)"
        )
        return _Watch(proc.wait(), self._incident(IncidentKind.TIMEOUT, running, detail))

    def _note_wall(self, check: str, seconds: float) -> None:
        slowest = self.outcome.slowest_check
        if slowest is None or seconds > slowest[1]:
            self.outcome.slowest_check = (check, round(seconds, 2))

    def _session_ended(self) -> bool:
        results = self._written()
        return results is not None and results["complete"]

    def _incident(self, kind: IncidentKind, running: str, detail: str) -> Incident:
        return Incident(kind=kind.value, check=running or None, detail=detail, at_s=self._elapsed())

    def _record(self, incident: Incident) -> None:
        """The check a fault stopped, handed to the next process to record (so it is not run
        again): a timeout or the memory limit FAILs it, a crash makes it an ERROR."""
        check = incident["check"]
        assert check is not None
        outcome = Outcome.ERROR if incident["kind"] == IncidentKind.CRASH else Outcome.FAIL
        what = {
            IncidentKind.TIMEOUT: "",
            IncidentKind.MEMORY: "",
            IncidentKind.CRASH: "the target process died during this check: ",
        }[IncidentKind(incident["kind"])]
        self.stopped = [c for c in self.stopped if c["id"] != check]
        self.stopped.append(
            StoppedCheck(
                id=check,
                outcome=outcome.value,
                reason=f"{what}{incident['detail']}; the run went on from the next check",
            )
        )
        write_stopped_checks(self.stopped_file, self.stopped)

    def _give_up(self) -> None:
        results = self._written()
        left = results["selected"] - self._checks_done() if results else -1
        detail = f"stopped after {self.limits.max_restarts} restarts" + (
            f"; {left} checks were not run" if left >= 0 else ""
        )
        self.outcome.incidents.append(self._incident(IncidentKind.GAVE_UP, "", detail))


def merge_supervised(parts: list[Supervised]) -> Supervised:
    """What the supervisors of one target's check groups saw, as one: every incident (in the
    order they happened), the restarts summed, the memory of the groups' process groups summed
    (they run at once), the slowest check, the longest wall time."""
    if not parts:
        raise ValueError("merge_supervised: expected at least one group, got none")
    failing = [p.exit_status for p in parts if p.exit_status != 0]
    slowest = [p.slowest_check for p in parts if p.slowest_check is not None]
    derived = [p.derived_check_timeout_s for p in parts if p.derived_check_timeout_s is not None]
    with_incidents = [p for p in parts if p.incidents]
    return Supervised(
        exit_status=failing[0] if failing else 0,
        incidents=sorted((i for p in parts for i in p.incidents), key=lambda i: i["at_s"]),
        restarts=sum(p.restarts for p in parts),
        peak_memory_gib=sum(p.peak_memory_gib for p in parts),
        slowest_check=max(slowest, key=lambda c: c[1]) if slowest else None,
        derived_check_timeout_s=max(derived) if derived else None,
        wall_s=max(p.wall_s for p in parts),
        forked=sum(p.forked for p in parts),
        started_new=sum(p.started_new for p in parts),
        past_derived_limit=[check for p in parts for check in p.past_derived_limit],
        output_tail=(with_incidents or parts)[-1].output_tail,
    )
