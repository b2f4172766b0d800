"""Warm fork servers: the preloaded parents of target processes, kept between main jobs.

Each main job starts a fork server per kind (:mod:`harness.jobs.forkserver`), which imports torch
and vLLM before the first target process forks: 15 s of a warm rerun's 90 s on a 2-core
machine, paid again by every run. ``--keep-warm MINUTES`` keeps the servers it starts after the
job ends, each ending by itself once it has had nothing to do for that long; every later main
job (and the gate) of this checkout forks its processes from them instead of starting its own,
with or without the option, while they are still what that job would start:

- the same kind, Python, checkout and interpreter variables, and the same values of the
  variables that steer what the checks do (:data:`harness.jobs.kept.OUTCOME_ENV_PREFIXES`):
  they form the server's key, and servers of other keys wait beside it;
- every file the server imported unchanged since (a server lists them, with their sizes and
  modification times, once it has preloaded): a server whose code changed is retired (it ends
  as soon as its last child does) and a new one takes its place. The model family's own
  modules are not among them: each child imports them again (the file under test may be
  another).

``--keep-warm 0`` retires the job's warm servers and keeps none. A server waits in
:func:`warm_folder` (``NEMOTRON_VL_WARM_SERVERS`` names another): one short file per server
(``KIND-KEY.json``: its process id, socket and idle time), its socket and its list of files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT
from harness.jobs.forkserver import (
    ForkServer,
    failed_path,
    fork_servers,
    interpreter_variables,
    loaded_files_changed,
    loaded_files_path,
    shared_servers,
    start_server,
)
from harness.jobs.kept import OUTCOME_ENV_IGNORED, OUTCOME_ENV_PREFIXES
from harness.jobs.preload import process_running

#: The environment variable naming the folder of the warm servers.
WARM_SERVERS_ENV = "NEMOTRON_VL_WARM_SERVERS"
#: How long a warm server waits for the next job when ``--keep-warm`` names no time.
DEFAULT_KEEP_WARM_MIN = 15.0
#: The longest path of a Unix socket (Linux: 108 bytes with the terminating null).
SOCKET_PATH_LIMIT = 107


def warm_folder() -> Path:
    """Where this checkout's warm servers wait: ``NEMOTRON_VL_WARM_SERVERS``, else a folder of
    this user's in the system's temporary folder (a Unix socket's path must stay under 108
    bytes, which a checkout's deep folder may not allow)."""
    named = os.environ.get(WARM_SERVERS_ENV, "").strip()
    if named:
        return Path(named)
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"nemotron-vl-warm-{os.getuid()}-{checkout}"


def server_key(kind: str, environ: Mapping[str, str]) -> str:
    """What a warm server must share with a job that forks from it, as a short digest: its
    kind, Python, checkout, interpreter variables and the variables that steer the checks."""
    steering = {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(OUTCOME_ENV_PREFIXES) and name not in OUTCOME_ENV_IGNORED
    }
    identity = {
        "kind": kind,
        "python": sys.executable,
        "checkout": str(ROOT),
        "interpreter": interpreter_variables(environ),
        "environment": steering,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WarmServer:
    """One warm server's file (``KIND-KEY.json``)."""

    kind: str
    pid: int
    socket: Path
    idle_exit_s: float
    started: float  # time.time() when it was started
    interpreter: dict[str, str]

    def as_fork_server(self) -> ForkServer:
        return ForkServer(self.kind, self.socket, None, self.interpreter, self.pid)


def _entry_path(folder: Path, kind: str, key: str) -> Path:
    return folder / f"{kind}-{key}.json"


def _read_entry(path: Path) -> WarmServer | None:
    try:
        data = json.loads(path.read_text())
        return WarmServer(
            kind=str(data["kind"]),
            pid=int(data["pid"]),
            socket=Path(data["socket"]),
            idle_exit_s=float(data["idle_exit_s"]),
            started=float(data["started"]),
            interpreter={str(k): str(v) for k, v in data["interpreter"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_entry(path: Path, server: WarmServer) -> None:
    data = {
        "kind": server.kind,
        "pid": server.pid,
        "socket": str(server.socket),
        "idle_exit_s": server.idle_exit_s,
        "started": server.started,
        "interpreter": server.interpreter,
    }
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The folder to this process alone while it looks for, retires or starts servers (two main
    jobs that start together start one server of a key, not two)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _retire(path: Path, server: WarmServer | None) -> None:
    """No later job forks from this server: its file is removed, and it ends as soon as it is
    idle (SIGUSR1; a child it runs for another job finishes first)."""
    path.unlink(missing_ok=True)
    if server is not None and process_running(server.pid):
        with contextlib.suppress(OSError):
            os.kill(server.pid, signal.SIGUSR1)


def _current(path: Path) -> tuple[WarmServer | None, str]:
    """The server of ``path`` if a job may fork from it, else None and why not (a server that
    is not is retired)."""
    server = _read_entry(path)
    if server is None:
        return None, "no warm server"
    if not process_running(server.pid):
        for leftover in (path, server.socket, loaded_files_path(server.socket)):
            leftover.unlink(missing_ok=True)
        failed = failed_path(server.socket)
        cause = (
            failed.read_text(errors="replace").strip().splitlines()[-1:] if failed.is_file() else []
        )
        failed.unlink(missing_ok=True)
        return None, f"its warm server (pid {server.pid}) has ended" + (
            f": its preload failed: {cause[0]}" if cause else ""
        )
    changed = loaded_files_changed(server.socket)
    if changed is not None:
        _retire(path, server)
        return None, f"its warm server (pid {server.pid}) was retired: {changed}"
    return server, ""


def warm_servers(
    kinds: Sequence[str], keep_warm_min: float | None, *, folder: Path | None = None
) -> tuple[dict[str, ForkServer], list[str]]:
    """The warm servers of ``kinds`` a job may fork from (started now for those it lacks when
    ``keep_warm_min`` > 0; all of them retired when it is 0), and a line for the console about
    each kind."""
    folder = warm_folder() if folder is None else folder
    found: dict[str, ForkServer] = {}
    lines: list[str] = []
    if keep_warm_min is None and not folder.is_dir():
        return found, lines  # none was ever kept here
    with _locked(folder):
        for kind in dict.fromkeys(kinds):
            path = _entry_path(folder, kind, server_key(kind, os.environ))
            server, why = _current(path)
            if keep_warm_min == 0:
                if server is not None:
                    _retire(path, server)
                    lines.append(f"{kind}: its warm server (pid {server.pid}) was retired")
                continue
            if server is None and keep_warm_min is not None:
                socket = _socket_path(path)
                if len(os.fsencode(socket)) > SOCKET_PATH_LIMIT:
                    lines.append(
                        f"{kind}: no warm server kept: its socket's path would be "
                        f"{len(os.fsencode(socket))} bytes, over the system's {SOCKET_PATH_LIMIT} "
                        f"({WARM_SERVERS_ENV}={folder} names too deep a folder)"
                    )
                    continue
                server = _start(socket, path, kind, keep_warm_min * 60.0)
                lines.append(
                    f"{kind}: a warm server started (pid {server.pid}; {why}); it ends after "
                    f"{keep_warm_min:g} minutes with nothing to do"
                )
            elif server is not None:
                started = time.strftime("%H:%M:%S", time.localtime(server.started))
                lines.append(
                    f"{kind}: forked from the warm server started at {started} (pid "
                    f"{server.pid}; it ends after {server.idle_exit_s / 60:g} minutes with "
                    "nothing to do)"
                )
            if server is not None:
                found[kind] = server.as_fork_server()
    return found, lines


def _socket_path(entry: Path) -> Path:
    """A new server's socket, beside its file: each server its own (a retired one keeps its
    own until it ends)."""
    return entry.with_name(f"{entry.stem}-{os.urandom(4).hex()}.sock")


def _start(socket: Path, path: Path, kind: str, idle_exit_s: float) -> WarmServer:
    started = start_server(kind, socket.parent, name=socket.name, idle_exit_s=idle_exit_s)
    assert started.process is not None
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


@contextlib.contextmanager
def job_fork_servers(
    kinds: Sequence[str], keep_warm_min: float | None = None
) -> Iterator[dict[str, ForkServer]]:
    """A main job's fork servers, one of each of ``kinds``: the test run's (shared), else the
    warm ones (:func:`warm_servers`), else started for the job and stopped at its end."""
    wanted = list(dict.fromkeys(kinds))
    shared = shared_servers(wanted)
    if shared is not None:
        yield shared
        return
    warm, lines = warm_servers(wanted, keep_warm_min)
    for line in lines:
        print(f"=== fork servers: {line} ===", flush=True)
    with fork_servers([kind for kind in wanted if kind not in warm]) as started:
        yield {**warm, **started}
