"""Warm fork servers: the preloaded parents of target processes, kept between main jobs.

Each main job starts a fork server per kind (:mod:`harness.jobs.forkserver`), which imports torch
and vLLM before the first target process forks: 15 s of a warm rerun's 90 s on a 2-core
machine, paid again by every run. ``--keep-warm MINUTES`` keeps the servers it starts after the
job ends, each ending by itself once it has had nothing to do for that long; every later main
job (and the gate) of this checkout forks its processes from them instead of starting its own,
with or without the option, while they are still what that job would start:

- the same kind, Python, checkout and interpreter variables, the same values of the
  variables that steer what the checks do (:func:`harness.jobs.kept.steering_environment`) or
  are read as a process starts, and the same process settings a child inherits (CPU affinity,
  control group, resource limits): they form the server's key, and servers of other keys wait
  beside it;
- every file the server imported unchanged since (a server lists them, with their sizes and
  modification times, once it has preloaded; one modified during the preload counts as changed
  from the start): a server whose code changed is retired (it ends once idle) and a new one
  takes its place. The model family's own modules are not among them: each child imports them
  again (the file under test may be another).

A job holds each server it uses by a lease (a shared ``flock``) until it ends: a server ends
only once idle that long with its lease free, or, retired (SIGUSR1), as soon as its lease is
free. ``--keep-warm 0`` retires every warm server of the checkout. The servers wait in
:func:`warm_folder` (``NEMOTRON_VL_WARM_SERVERS`` names another), which must be this user's
alone: one short file per server (``KIND-KEY.json``: its process id, socket and idle time), its
socket, its list of files and its lease.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from harness import ROOT
from harness.jobs.forkserver import (
    ForkServer,
    failed_cause,
    failed_path,
    fork_servers,
    interpreter_variables,
    lease_path,
    loaded_files_changed,
    loaded_files_path,
    shared_servers,
    start_server,
)
from harness.jobs.kept import key_digest, steering_environment
from harness.jobs.preload import process_running
from harness.jobs.results import replace_text

#: The environment variable naming the folder of the warm servers.
WARM_SERVERS_ENV = "NEMOTRON_VL_WARM_SERVERS"
#: How long a warm server waits for the next job when ``--keep-warm`` names no time.
DEFAULT_KEEP_WARM_MIN = 15.0


def add_keep_warm_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--keep-warm [MINUTES]``: keep the fork servers a run starts (``what`` they are) for
    later runs, each ending after MINUTES with nothing to do."""
    parser.add_argument(
        "--keep-warm",
        type=float,
        nargs="?",
        const=DEFAULT_KEEP_WARM_MIN,
        default=None,
        metavar="MINUTES",
        help=f"keep {what} for later runs, each ending after MINUTES with nothing to do "
        f"(default {DEFAULT_KEEP_WARM_MIN:g}); 0 ends those kept (harness/jobs/warm.py). "
        "Later runs fork from them with or without this option",
    )


#: The longest a new server's command takes to show in ``/proc`` (it is being executed).
EXEC_LIMIT_S = 5.0
#: The longest path of a Unix socket (Linux: 108 bytes with the terminating null).
SOCKET_PATH_LIMIT = 107


def warm_folder() -> Path:
    """Where this checkout's warm servers wait: ``NEMOTRON_VL_WARM_SERVERS``, else a folder of
    this user's in the system's temporary folder (a Unix socket's path must stay under 108
    bytes, which a checkout's deep folder may not allow)."""
    named = os.environ.get(WARM_SERVERS_ENV, "").strip()
    if named:
        return Path(named).absolute()  # the servers run in the checkout, jobs anywhere
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"nemotron-vl-warm-{os.getuid()}-{checkout}"


#: Read by a process once, when it starts or as it imports, beyond the steering variables
#: (:func:`harness.jobs.kept.steering_environment`): a child forked from a server has the
#: server's.
LOAD_TIME_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "ATEN_CPU_CAPABILITY", "TZ", "TMPDIR")
LOAD_TIME_PREFIXES = ("KMP_",)
#: The limits a child inherits from its server, not from the job that asked for it.
INHERITED_LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_CORE")


def process_settings() -> dict[str, object]:
    """What a forked child inherits from its server's process rather than from the job: its
    CPU affinity, control group, resource limits and niceness."""
    settings: dict[str, object] = {"nice": os.nice(0)}
    if hasattr(os, "sched_getaffinity"):
        settings["affinity"] = sorted(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        settings["cgroup"] = Path("/proc/self/cgroup").read_text()
    for name in INHERITED_LIMITS:
        if hasattr(resource, name):
            settings[name] = list(resource.getrlimit(getattr(resource, name)))
    return settings


def server_key(kind: str, environ: Mapping[str, str]) -> str:
    """What a warm server must share with a job that forks from it, as a short digest: its
    kind, Python, checkout, interpreter variables, the variables that steer the checks or are
    read as a process starts, and this process's settings a child inherits
    (:func:`process_settings`)."""
    load_time = {
        name: value
        for name, value in sorted(environ.items())
        if name in LOAD_TIME_VARIABLES or name.startswith(LOAD_TIME_PREFIXES)
    }
    identity = {
        "kind": kind,
        "python": sys.executable,
        "checkout": str(ROOT),
        "interpreter": interpreter_variables(environ),
        "environment": steering_environment(environ),
        "load_time": load_time,
        "process": process_settings(),
    }
    return key_digest(identity, 16)


@dataclass(frozen=True)
class WarmServer:
    """One warm server's file (``KIND-KEY.json``)."""

    kind: str
    pid: int
    socket: Path
    idle_exit_s: float
    #: ``time.time()`` when it was started
    started: float
    interpreter: dict[str, str]

    def as_fork_server(self) -> ForkServer:
        return ForkServer(self.kind, self.socket, None, self.interpreter, self.pid)

    def runs(self) -> bool:
        """Whether its process still runs and is this server (its command names its socket):
        a process id is used again once its process ends."""
        try:
            command = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return process_running(self.pid) and os.fsencode(self.socket) in command


def _entry_path(folder: Path, kind: str, key: str) -> Path:
    return folder / f"{kind}-{key}.json"


def _read_entry(path: Path) -> WarmServer | str:
    """The server ``path`` describes, or why it describes none."""
    try:
        data = json.loads(path.read_text())
        server = WarmServer(
            kind=str(data["kind"]),
            pid=int(data["pid"]),
            socket=Path(data["socket"]),
            idle_exit_s=float(data["idle_exit_s"]),
            started=float(data["started"]),
            interpreter={str(k): str(v) for k, v in data["interpreter"].items()},
        )
    except FileNotFoundError:
        return "no warm server"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{path} cannot be read: {type(e).__name__}: {e}"
    if server.socket.parent != path.parent:
        return f"{path} names a socket outside its folder ({server.socket})"
    return server


def _write_entry(path: Path, server: WarmServer) -> None:
    replace_text(path, json.dumps({**asdict(server), "socket": str(server.socket)}))


def _unsafe(folder: Path) -> str | None:
    """Why ``folder`` may not hold this user's servers (a folder in a shared temporary folder
    that someone else made, or others may write in), or None."""
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder}: expected a folder (not a link), got mode {stat.filemode(info.st_mode)}"
    if info.st_uid != os.getuid():
        return f"{folder}: expected owner uid {os.getuid()}, got {info.st_uid}"
    if info.st_mode & 0o077:
        mode = stat.filemode(info.st_mode)
        return f"{folder}: expected mode drwx------ (others may not enter it), got {mode}"
    return None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The folder to this process alone while it looks for, retires or starts servers (two main
    jobs that start together start one server of a key, not two)."""
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _retire(path: Path, server: WarmServer) -> None:
    """No later job forks from this server: its file is removed, and it ends as soon as it is
    idle (SIGUSR1; what it runs for other jobs, and their leases, first)."""
    path.unlink(missing_ok=True)
    if server.runs():
        with contextlib.suppress(OSError):
            os.kill(server.pid, signal.SIGUSR1)


def _forget(path: Path, server: WarmServer) -> str:
    """A server that ended: its file and what it left removed; how it ended."""
    cause = failed_cause(server.socket)
    socket = server.socket
    for leftover in (
        path,
        socket,
        failed_path(socket),
        loaded_files_path(socket),
        lease_path(socket),
    ):
        leftover.unlink(missing_ok=True)
    return f"its warm server (pid {server.pid}) has ended" + (
        f": its preload failed: {cause}" if cause else ""
    )


def _lease(server: WarmServer) -> IO[bytes] | None:
    """The server's lease, held shared until it is closed; None when the server is ending (it
    holds its lease whole) or its lease is gone."""
    try:
        # Held open for the job, past this function: no context manager here.
        lease = open(lease_path(server.socket), "rb")  # noqa: SIM115
    except OSError:
        return None
    try:
        fcntl.flock(lease, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        lease.close()
        return None
    return lease


def _current(path: Path) -> tuple[WarmServer | None, IO[bytes] | None, str]:
    """The server of ``path`` with its lease taken if a job may fork from it; else None and why
    not (a server whose files changed is retired, one that ended is forgotten)."""
    server = _read_entry(path)
    if isinstance(server, str):
        if path.exists():
            path.unlink()
        return None, None, server
    if not server.runs():
        return None, None, _forget(path, server)
    changed = loaded_files_changed(server.socket)
    if changed is not None:
        _retire(path, server)
        return None, None, f"its warm server (pid {server.pid}) was retired: {changed}"
    lease = _lease(server)
    if lease is None:
        return None, None, f"its warm server (pid {server.pid}) is ending"
    return server, lease, ""


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:g} minute" + ("" if minutes == 1 else "s")


@contextlib.contextmanager
def warm_servers(
    kinds: Sequence[str], keep_warm_min: float | None, *, folder: Path | None = None
) -> Iterator[tuple[dict[str, ForkServer], list[str]]]:
    """For the block: the warm servers of ``kinds`` a job may fork from (started now for those
    it lacks when ``keep_warm_min`` is given), their leases held (none ends while the block
    runs), and a line for the console about each kind. A folder that may not hold them (not
    this user's alone) keeps none, and says why."""
    folder = warm_folder() if folder is None else folder
    found: dict[str, ForkServer] = {}
    lines: list[str] = []
    with contextlib.ExitStack() as leases:
        try:
            _gather(folder, kinds, keep_warm_min, found, lines, leases)
        except OSError as e:
            leases.close()
            found.clear()
            lines.append(f"no warm server: {folder}: {type(e).__name__}: {e}")
        yield found, lines


def _gather(
    folder: Path,
    kinds: Sequence[str],
    keep_warm_min: float | None,
    found: dict[str, ForkServer],
    lines: list[str],
    leases: contextlib.ExitStack,
) -> None:
    if keep_warm_min is not None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not folder.exists():
        return  # none was ever kept here
    problem = _unsafe(folder)
    if problem is not None:
        if keep_warm_min is not None:
            lines.append(f"no warm server: {problem}")
        return
    with _locked(folder):
        for kind in dict.fromkeys(kinds):
            lines.append(f"{kind}: {_use_or_start(folder, kind, keep_warm_min, found, leases)}")


def _use_or_start(
    folder: Path,
    kind: str,
    keep_warm_min: float | None,
    found: dict[str, ForkServer],
    leases: contextlib.ExitStack,
) -> str:
    path = _entry_path(folder, kind, server_key(kind, os.environ))
    server, lease, why = _current(path)
    if server is None and keep_warm_min is not None:
        socket = _socket_path(path)
        # The server binds a longer name first (".NAME.PID"; pids have at most 7 digits).
        longest = len(os.fsencode(socket)) + len(".") + len(".4194304")
        if longest > SOCKET_PATH_LIMIT:
            return (
                f"no warm server kept: its socket's path would be {longest} bytes, over the "
                f"system's {SOCKET_PATH_LIMIT} ({folder} is too deep a folder)"
            )
        server = _start(socket, path, kind, keep_warm_min * 60.0)
        lease = _lease(server)
        said = "" if why == "no warm server" else f"; {why}"
        line = (
            f"a warm server started (pid {server.pid}{said}); it ends after "
            f"{_minutes(server.idle_exit_s)} with nothing to do"
        )
    elif server is not None:
        started = time.strftime("%H:%M:%S", time.localtime(server.started))
        line = (
            f"forked from the warm server started at {started} (pid {server.pid}; it ends "
            f"after {_minutes(server.idle_exit_s)} with nothing to do)"
        )
    else:
        return f"a server for this run alone ({why})"
    if lease is not None:
        leases.enter_context(lease)
    found[kind] = server.as_fork_server()
    return line


def _socket_path(entry: Path) -> Path:
    """A new server's socket, beside its file: each server its own (a retired one keeps its
    own until it ends)."""
    return entry.with_name(f"{entry.stem}-{os.urandom(4).hex()}.sock")


def _start(socket: Path, path: Path, kind: str, idle_exit_s: float) -> WarmServer:
    lease_path(socket).touch(mode=0o600)  # before it starts: the job takes it at once
    started = start_server(kind, socket.parent, name=socket.name, idle_exit_s=idle_exit_s)
    assert started.process is not None
    _STARTED.append(started.process)
    # Popen may return before the kernel shows the server's command (WarmServer.runs).
    deadline = time.monotonic() + EXEC_LIMIT_S
    command = Path(f"/proc/{started.process.pid}/cmdline")
    while time.monotonic() < deadline and started.process.poll() is None:
        with contextlib.suppress(OSError):
            if command.read_bytes():
                break
        time.sleep(0.01)
    server = WarmServer(
        kind=kind,
        pid=started.process.pid,
        socket=started.path,
        idle_exit_s=idle_exit_s,
        started=time.time(),
        interpreter=started.interpreter,
    )
    _write_entry(path, server)
    return server


#: The servers this process started: referenced while it runs (its own children, reaped as
#: they end), left to run on when it ends.
_STARTED: list[subprocess.Popen[bytes]] = []


def retire_all(*, folder: Path | None = None) -> list[str]:
    """``--keep-warm 0``: retire every warm server of this checkout (of any key); a line for
    each."""
    folder = warm_folder() if folder is None else folder
    if not folder.is_dir() or _unsafe(folder) is not None:
        return []
    lines = []
    with _locked(folder):
        for path in sorted(folder.glob("*.json")):
            server = _read_entry(path)
            if isinstance(server, str):
                path.unlink(missing_ok=True)
            elif server.runs():
                _retire(path, server)
                lines.append(f"{server.kind}: its warm server (pid {server.pid}) was retired")
            else:
                _forget(path, server)
    return lines


@contextlib.contextmanager
def job_fork_servers(
    kinds: Sequence[str], keep_warm_min: float | None = None
) -> Iterator[dict[str, ForkServer]]:
    """A main job's fork servers, one of each of ``kinds``: the test run's (shared), else the
    warm ones (:func:`warm_servers`), else started for the job and stopped at its end."""
    wanted = list(dict.fromkeys(kinds))
    shared = shared_servers(wanted)
    if shared is not None:
        if keep_warm_min:
            print("=== fork servers: the test run's; none kept warm ===", flush=True)
        yield shared
        return
    with warm_servers(wanted, keep_warm_min) as (warm, lines):
        for line in lines:
            print(f"=== fork servers: {line} ===", flush=True)
        with fork_servers([kind for kind in wanted if kind not in warm]) as started:
            yield {**warm, **started}
