"""A target's process group, seen from outside: its resident memory, signalling and killing it
(started new, or forked from a fork server), and how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress
from typing import IO, Protocol

from harness.jobs.forkserver import ForkedProcess

#: Seconds a killed process group has to end before the next, harder step.
KILL_GRACE_S = 5.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def group_memory_bytes(pgid: int) -> int:
    """Resident memory of every process in group ``pgid`` and of their descendants in groups of
    their own (a server a check started in a session of its own, with its engine's processes),
    from Linux's ``/proc`` (0 elsewhere)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    parents: dict[int, int] = {}
    counted: set[int] = set()
    pages: dict[int, int] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            fields = stat[stat.rindex(")") + 2 :].split()
            with open(f"/proc/{entry}/statm") as f:
                pages[int(entry)] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        parents[int(entry)] = int(fields[1])
        if int(fields[2]) == pgid:
            counted.add(int(entry))
    grown = True
    while grown:  # the descendants, whatever their group
        found = {pid for pid, parent in parents.items() if parent in counted} - counted
        counted |= found
        grown = bool(found)
    return sum(pages[pid] for pid in counted) * _PAGE


class TargetProcess(Protocol):
    """A target's pytest process, in its own session: started new (``subprocess.Popen``) or
    forked from a fork server (:class:`harness.jobs.forkserver.ForkedProcess`)."""

    pid: int
    returncode: int | None

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def signal_group(proc: TargetProcess, signum: int) -> None:
    """Signal the target's whole process group (its own session)."""
    if isinstance(proc, ForkedProcess):
        proc.signal_group(signum)  # through its server, which has not reaped it yet
        return
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def kill_group(proc: TargetProcess, signum: int = signal.SIGKILL) -> None:
    """Kill the target's whole process group and reap it (a forked one's server reaps it; one
    whose server does not answer is killed from here and counted as killed)."""
    signal_group(proc, signum)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        if not isinstance(proc, ForkedProcess):
            signal_group(proc, signal.SIGKILL)
            proc.wait()
            return
        proc.signal_group(signal.SIGKILL, direct=True)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.abandon()


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} ({-returncode})"
    return f"exited with status {returncode} before its pytest session ended"
