"""A preloaded parent for the supervisor's target processes: each one a fork, not a new Python.

A target process starts by importing torch, pytest, hypothesis and, for vLLM's targets, vLLM
with everything its model's build imports: about 10 s of CPU on a 2-core machine, paid again by
every process a main job starts (one per target and check group, and one more after each fault).
A fork server imports torch, pytest and vLLM once
(:func:`harness.jobs.preload.preload_target_imports`); each target process is a fork of it that
runs ``pytest.main(ARGS)`` in the environment, folder and ``sys.path`` a new ``python -m pytest``
would have, and ends as a new Python ends (its threads waited for, its exit handlers run). Asked
for another module, a fork runs it as ``python -m MODULE ARGS`` would: the harness's tests run
its commands that build vLLM's models this way. What a fork cannot change is refused: a process
whose ``PYTHON*`` variables differ from the server's starts as a new Python. Forks share the
server's hash seed (set ``PYTHONHASHSEED``, as the nox sessions do, for runs that repeat).

The server listens on a Unix socket (``SOCK_SEQPACKET``: one message per request or answer).
A client sends one request, a JSON object ``{"args": [...], "env": {...}, "cwd": "..."}`` (and
``"module"``, pytest's by default), with the write end of its output pipe attached; the server
forks a child, which starts its own session (its process group is the pid: the supervisor
samples and kills the group, as it does a process it started) and runs the session, and answers
``pid N``. When the child ends the server answers ``exit S`` (S as
:func:`os.waitstatus_to_exitcode` gives it: negative for a signal).
The client may send ``kill SIG`` meanwhile: the server signals the child's group while the child
is still its own (not yet reaped), so a pid used again is never signalled. A client that goes
away takes its child with it (SIGKILL to its group); a server whose standard input closes (the
main job ended) kills its children and exits. A warm server (``--idle-exit``, kept between main
jobs by :mod:`harness.jobs.warm`) ignores its input and ends once it has had no client, no child
and no job holding its lease for that long, or at once when so (SIGUSR1: retired).

The server only imports before it forks: it starts no torch thread pool (a child that inherits
a used OpenMP pool waits for its threads forever), so each child sets its own thread count, as
a new process would from ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness import ROOT
from harness.jobs.preload import (
    fork_frozen,
    imported_files,
    output_to,
    preload_target_imports,
    process_running,
)
from harness.jobs.results import replace_text

#: What a fork server preloads: ``torch`` (torch and pytest: the reference's targets) or ``vllm``
#: (also vLLM and what its model's build imports).
KINDS = ("torch", "vllm")
#: The longest a server may take to import what it preloads (measured: 11 s on a 2-core
#: machine; a loaded machine without AVX-512 is several times slower).
PRELOAD_LIMIT_S = 300.0
#: The longest a ready server takes to answer a request with its child's pid (a fork: ms).
ANSWER_LIMIT_S = 60.0
POLL_S = 0.05
#: How often a warm server with no child looks at its idle time.
IDLE_POLL_S = 1.0
_MESSAGE = 1 << 20  # the largest message: a request carries the whole environment
#: The folder of the fork servers a test run shares with the main jobs its tests start.
SHARED_SERVERS_ENV = "NEMOTRON_VL_FORK_SERVERS"


#: The module a request runs unless it names another.
PYTEST = "pytest"


#: Read when an interpreter starts (PYTHONHASHSEED, PYTHONWARNINGS, ...): a child forked from a
#: server started with other values would not be the process asked for. PYTHONPATH is applied
#: in the child; the thread counts are set there.
def interpreter_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}


def kind_of(selector: str) -> str:
    """The fork server a target's processes come from: vLLM's targets need vLLM preloaded."""
    return "vllm" if selector.startswith("vllm") else "torch"


# ---------------------------------------------------------------------------------------------
# The server


@dataclass
class _Client:
    conn: socket.socket
    pid: int | None = None


@dataclass
class _Server:
    listener: socket.socket
    #: a warm server's: it ends after this many seconds with no client, no child and no job
    #: holding its lease, and it ignores its standard input (None: it ends when its standard
    #: input closes)
    idle_exit_s: float | None = None
    #: a warm server's lease (:func:`lease_path`): jobs that may still fork from it hold it shared
    lease: Path | None = None
    clients: dict[int, _Client] = field(default_factory=dict)  # by the connection's fd
    children: dict[int, _Client] = field(default_factory=dict)  # by the child's pid

    def serve(self) -> None:
        """Answer requests until standard input closes, or a warm server's idle time ends
        (retired, by SIGUSR1: as soon as it is idle)."""
        stdin = sys.stdin.fileno() if self.idle_exit_s is None else None
        idle_since = time.monotonic()
        while True:
            sockets = [self.listener.fileno(), *self.clients]
            # Children are reaped by polling; with none, a request or the input wakes it.
            wait = POLL_S if self.children or self.idle_exit_s is None else IDLE_POLL_S
            ready, _, _ = select.select(
                sockets + ([stdin] if stdin is not None else []), [], [], wait
            )
            for fd in ready:
                if fd == stdin:
                    if not os.read(stdin, 1 << 12):
                        self._stop()
                        return
                elif fd == self.listener.fileno():
                    conn, _ = self.listener.accept()
                    self.clients[conn.fileno()] = _Client(conn)
                else:
                    self._receive(self.clients[fd])
            self._reap()
            if self.idle_exit_s is not None:
                now = time.monotonic()
                limit = 0.0 if _RETIRED.is_set() else self.idle_exit_s
                if self.clients or self.children:
                    idle_since = now
                elif now - idle_since >= limit:
                    if self._lease_released():
                        return
                    idle_since = now  # a job holds it: it may fork again

    def _lease_released(self) -> bool:
        """Whether no job holds the lease; if so it is now this server's, for good (a job that
        looks for the server afterwards cannot take it, and starts another)."""
        if self.lease is None:
            return True
        held = os.open(self.lease, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(held)
            return False
        return True  # the descriptor stays open, and the lock with it, until the process ends

    def _receive(self, client: _Client) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(client.conn, _MESSAGE, 1)
        except OSError:
            data, fds = b"", []
        if not data:  # the client went away: its child goes too
            if client.pid is not None and client.pid in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(client.pid, signal.SIGKILL)
            self._drop(client)
            return
        text = data.decode(errors="replace")
        if text.startswith("kill "):
            try:
                signum = signal.Signals(int(text.split()[1]))
            except (ValueError, IndexError) as e:
                self._answer(client, f"error: kill: expected a signal number, got {text!r}: {e}")
                return
            if client.pid is not None and client.pid in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(client.pid, signum)
            return
        if client.pid is not None or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self._answer(client, "error: expected one request, with its output pipe attached")
            return
        (output,) = fds
        try:
            request = json.loads(text)
            args, env, cwd = request["args"], request["env"], request["cwd"]
            module = request.get("module", PYTEST)
            if not (
                isinstance(args, list)
                and all(isinstance(a, str) for a in args)
                and isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                and isinstance(cwd, str)
                and isinstance(module, str)
                and module
            ):
                raise TypeError(
                    "args: a list of strings, env: strings by name, cwd: a string, module "
                    "(optional): a module's name"
                )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            os.close(output)
            self._answer(
                client, f"error: a request is a JSON object of args, env, cwd (and module): {e}"
            )
            return
        client.pid = self._fork(module, args, env, cwd, output)
        self.children[client.pid] = client
        self._answer(client, f"pid {client.pid}")

    def _fork(
        self, module: str, args: list[str], env: dict[str, str], cwd: str, output: int
    ) -> int:
        started_r, started_w = os.pipe()
        pid = fork_frozen()
        if pid == 0:
            os.close(started_r)
            inherited = [self.listener, *self._connections()]
            _child(module, args, env, cwd, output, started_w, inherited)
        os.close(started_w)
        os.close(output)
        os.read(started_r, 1)  # its own session started (or it died): its group can be signalled
        os.close(started_r)
        return pid

    def _connections(self) -> list[socket.socket]:
        return [client.conn for client in self.clients.values()]

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            client = self.children.pop(pid, None)
            if client is not None:
                self._answer(client, f"exit {os.waitstatus_to_exitcode(status)}")

    def _answer(self, client: _Client, message: str) -> None:
        try:
            client.conn.send(message.encode())
        except OSError:
            self._drop(client)

    def _drop(self, client: _Client) -> None:
        self.clients.pop(client.conn.fileno(), None)
        client.conn.close()

    def _stop(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.children.clear()


def _child(
    module: str,
    args: list[str],
    env: dict[str, str],
    cwd: str,
    output: int,
    started: int,
    inherited: Sequence[socket.socket],
) -> None:
    """The forked child: a target process, as ``python -m MODULE ARGS`` (pytest, unless another
    module was asked for) would start in ``cwd`` with ``env``; it exits with the module's
    status and never returns."""
    status = 3
    try:
        os.setsid()  # its own process group: a limit kills whatever it started
        os.write(started, b"1")
        os.close(started)
        for sock in inherited:  # the server's: a client must see the server's end, not ours
            sock.close()
        # As a new Python starts: Ctrl-C raises KeyboardInterrupt, the rest are the system's.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        # What a new Python reads from its environment once, not on each use.
        tempfile.tempdir = None
        time.tzset()
        output_to(output)
        os.chdir(cwd)
        _set_search_path(os.environ.get("PYTHONPATH", ""), env.get("PYTHONPATH", ""))
        os.environ.clear()
        os.environ.update(env)
        import pytest
        import torch

        # A new process reads its thread count from the environment when torch starts; the
        # server's torch started before this child's environment was set.
        threads = env.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else _cores())
        if module == PYTEST:
            sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *args]  # as -m does
            status = int(pytest.main(args))
        else:
            sys.argv = [module, *args]  # its first item becomes the module's file, as -m sets it
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:  # as the interpreter does: the message to stderr, status 1
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        # pytest's internal error is 3; an uncaught exception ends a new Python with 1.
        status = 3 if module == PYTEST else 1
    finally:
        _shut_down()
        os._exit(status)


def _shut_down() -> None:
    """What a new Python does at its end before it exits: wait for its threads that are not
    daemons (a check that leaves one running hangs there, past its time limit, as it would in
    a new process), run the exit handlers, flush its streams. The child then leaves by
    ``os._exit``: it must never return into the server's loop."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        getattr(threading, "_shutdown", lambda: None)()
    with contextlib.suppress(BaseException):
        getattr(atexit, "_run_exitfuncs", lambda: None)()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()


def _path_entries(value: str) -> list[str]:
    return [os.path.abspath(entry) for entry in value.split(os.pathsep) if entry]


def _set_search_path(server: str, child: str) -> None:
    """``sys.path`` as ``python -m`` starts it in this folder with ``PYTHONPATH=child``: the
    folder, the variable's entries, then the installation's (the server's own entries out)."""
    own = set(_path_entries(server))
    rest = [entry for entry in sys.path[1:] if os.path.abspath(entry) not in own]
    sys.path[:] = [os.getcwd(), *_path_entries(child), *rest]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: Set by SIGUSR1 in a warm server (from its start, its preload included): it ends once idle.
_RETIRED = threading.Event()


def serve(path: Path, kind: str, idle_exit_s: float | None = None) -> None:
    """Preload, then listen on ``path`` (its socket appearing says the server is ready) and
    answer requests until standard input closes. A preload that fails leaves its cause in
    ``PATH.failed`` for the clients waiting. A warm server (``idle_exit_s``) also writes the
    files it imported (:func:`loaded_files_path`) before it listens, and ends after
    ``idle_exit_s`` seconds with nothing to do and its lease free, its files removed."""
    if idle_exit_s is not None:
        # Blocked since its start (start_server): one sent before now is delivered here.
        signal.signal(signal.SIGUSR1, lambda signum, frame: _RETIRED.set())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    preload_started_ns = time.time_ns()
    try:
        # Not the plugins (the harness's, hypothesis's): pytest rewrites their asserts, as in a
        # new process, only if it imports them itself.
        preload_target_imports(vllm=kind == "vllm")
        if idle_exit_s is not None:
            write_loaded_files(loaded_files_path(path), preload_started_ns)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Bound under another name and renamed once listening: a client that sees the path
        # never finds it refusing connections.
        bound = path.with_name(f".{path.name}.{os.getpid()}")
        listener.bind(str(bound))
        listener.listen(64)
        os.replace(bound, path)
    except BaseException:
        import traceback

        failed_path(path).write_text(traceback.format_exc())
        raise
    try:
        _Server(
            listener, idle_exit_s, lease_path(path) if idle_exit_s is not None else None
        ).serve()
    finally:
        if idle_exit_s is not None:
            for leftover in (path, loaded_files_path(path), lease_path(path)):
                leftover.unlink(missing_ok=True)


def failed_path(path: Path) -> Path:
    return path.with_name(path.name + ".failed")


def failed_cause(path: Path) -> str | None:
    """The last line of the traceback a server at ``path`` left when its preload failed."""
    try:
        lines = failed_path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1] if lines else "(no traceback)"


def loaded_files_path(path: Path) -> Path:
    """Where a warm server at ``path`` lists the files it imported, as they were."""
    return path.with_name(path.name + ".files")


def lease_path(path: Path) -> Path:
    """A warm server's lease: a job that may fork from it holds it shared (``flock``); the
    server ends only once it takes it whole."""
    return path.with_name(path.name + ".lease")


#: A file modified this close to (or after) the preload's start may have been imported as it was
#: before: listed as changed already (the file systems' clocks are coarser than a second).
MODIFIED_DURING_PRELOAD_NS = 1_000_000_000


def write_loaded_files(out: Path, preload_started_ns: int) -> None:
    """The source file of every module imported so far, with its size and modification time
    (``{path: [size, mtime_ns]}``): a server whose files changed since holds code that is no
    longer the checkout's or the installation's. A file modified since the preload started is
    listed as ``[-1, -1]`` (it may have been read before the change): the server is then stale
    from the start. Written whole or not at all."""
    files: dict[str, list[int]] = {}
    for name in imported_files():
        with contextlib.suppress(OSError):
            stat = os.stat(name)
            recent = stat.st_mtime_ns >= preload_started_ns - MODIFIED_DURING_PRELOAD_NS
            files[name] = [-1, -1] if recent else [stat.st_size, stat.st_mtime_ns]
    replace_text(out, json.dumps(files))


def loaded_files_changed(path: Path) -> str | None:
    """Which file a warm server at ``path`` imported has changed since (or is gone), or None.
    While it preloads (no socket yet) None: what it imports now is current; once it listens, a
    list that is missing or cannot be read counts as a change."""
    try:
        files = json.loads(loaded_files_path(path).read_text())
        rows = [(str(name), int(size), int(mtime_ns)) for name, (size, mtime_ns) in files.items()]
    except (OSError, ValueError, TypeError, AttributeError) as e:
        if not path.exists():
            return None
        return f"its list of imported files ({loaded_files_path(path)}) cannot be read: {e}"
    for name, size, mtime_ns in rows:
        try:
            stat = os.stat(name)
        except OSError:
            return f"{name} is gone"
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime_ns):
            return f"{name} changed"
    return None


# ---------------------------------------------------------------------------------------------
# The client


class ForkServerError(RuntimeError):
    """The fork server could not start a process (it is gone, or refused the request)."""


class ForkedProcess:
    """A target process a fork server started: what the supervisor uses of ``subprocess.Popen``
    (``pid``, ``stdout``, ``returncode``, ``poll``, ``wait``) and :meth:`signal_group`."""

    def __init__(
        self,
        path: Path,
        args: Sequence[str],
        env: dict[str, str],
        cwd: Path,
        *,
        module: str = PYTEST,
        quiet: bool = False,
    ) -> None:
        self.returncode: int | None = None
        #: the server ended (or stopped answering) before the child's exit status came
        self.server_lost = False
        # Quiet: the child's output goes nowhere, and nothing is there to read.
        read, write = (-1, os.open(os.devnull, os.O_WRONLY)) if quiet else os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(str(path))
            request = json.dumps(
                {"args": list(args), "env": env, "cwd": str(cwd), "module": module}
            ).encode()
            socket.send_fds(self._conn, [request], [write])
            os.close(write)
            write = -1
            answer = self._next(ANSWER_LIMIT_S)
        except (OSError, TimeoutError) as e:
            self._conn.close()
            if read >= 0:
                os.close(read)
            raise ForkServerError(f"fork server {path}: {e}") from e
        finally:
            if write >= 0:
                os.close(write)
        if not answer.startswith("pid "):
            self._conn.close()
            if read >= 0:
                os.close(read)
            raise ForkServerError(f"fork server {path}: {answer or 'it ended'}")
        self.pid = int(answer.split()[1])
        self.stdout: IO[bytes] | None = os.fdopen(read, "rb") if read >= 0 else None

    def _next(self, timeout: float | None) -> str:
        """The server's next answer ("" when it is gone); raises TimeoutError after
        ``timeout`` seconds."""
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no answer from the fork server in {timeout} s")
        try:
            return self._conn.recv(_MESSAGE).decode()
        except OSError:
            return ""

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self._settle(self._next(0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("fork server child", timeout or 0.0)
            try:
                self._settle(self._next(left))
            except TimeoutError:
                continue
        return self.returncode

    def _settle(self, answer: str) -> None:
        if answer.startswith("exit "):
            self.returncode = int(answer.split()[1])
        elif not answer:  # the server is gone: its child is taken down with it
            self.abandon()
        if self.returncode is not None:
            self._conn.close()

    def signal_group(self, signum: int, *, direct: bool = False) -> None:
        """Signal the child's process group: through the server, which signals it only while
        the child is its own (unreaped, so its pid is not another's); ``direct``, from here,
        when the server does not answer."""
        if self.returncode is not None:
            return
        if direct:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signum)
            return
        with contextlib.suppress(OSError):
            self._conn.send(f"kill {signum}".encode())

    def abandon(self) -> None:
        """The server is gone or does not answer: the child is killed from here and counted as
        killed (its exit status is the server's to know); ``server_lost`` says why."""
        self.server_lost = True
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = -signal.SIGKILL
        self._conn.close()


@dataclass
class ForkServer:
    """A server of one kind, at ``path``: started by this process (``process``), or by another
    and shared (a test run's, :data:`SHARED_SERVERS_ENV`)."""

    kind: str
    path: Path
    process: subprocess.Popen[bytes] | None = None
    #: the server's :func:`interpreter_variables`, which a child's must equal
    interpreter: dict[str, str] = field(default_factory=dict)
    #: a shared server's process id (``process`` None): whether it still runs
    server_pid: int | None = None

    def wait_ready(self, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Return once the server listens; raise :class:`ForkServerError` if its preload failed,
        it ended, it is not ready within :data:`PRELOAD_LIMIT_S`, or ``interrupted()``."""
        deadline = time.monotonic() + PRELOAD_LIMIT_S
        while not self.path.exists():
            cause = failed_cause(self.path)
            if cause is not None:
                raise ForkServerError(f"fork server {self.kind}: its preload failed: {cause}")
            if self.process is not None and self.process.poll() is not None:
                raise ForkServerError(
                    f"fork server {self.kind}: it ended ({self.process.returncode}) before it "
                    "was ready"
                )
            if self.server_pid is not None and not process_running(self.server_pid):
                raise ForkServerError(f"fork server {self.kind}: it ended before it was ready")
            if interrupted():
                raise ForkServerError(f"fork server {self.kind}: interrupted")
            if time.monotonic() > deadline:
                raise ForkServerError(
                    f"fork server {self.kind}: not ready in {PRELOAD_LIMIT_S:g} s"
                )
            time.sleep(POLL_S)

    def start(
        self,
        args: Sequence[str],
        env: dict[str, str],
        cwd: Path,
        *,
        module: str = PYTEST,
        quiet: bool = False,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> ForkedProcess:
        """``python -m MODULE ARGS`` (pytest's, unless another is named) in ``cwd`` with
        ``env``, forked from the server once it is ready. A process whose
        :func:`interpreter_variables` differ from the server's is refused
        (:class:`ForkServerError`): it must start as a new Python."""
        wanted = interpreter_variables(env)
        if wanted != self.interpreter:
            changed = sorted(
                k
                for k in wanted.keys() | self.interpreter.keys()
                if wanted.get(k) != self.interpreter.get(k)
            )
            raise ForkServerError(
                f"fork server {self.kind}: the process's {', '.join(changed)} differ from the "
                "server's (read when an interpreter starts)"
            )
        self.wait_ready(interrupted)
        return ForkedProcess(self.path, args, env, cwd, module=module, quiet=quiet)


def start_server(
    kind: str, folder: Path, *, name: str | None = None, idle_exit_s: float | None = None
) -> ForkServer:
    """A fork server of ``kind`` in ``folder`` (its socket ``name``, by default ``KIND.sock``),
    started now; it preloads in the background (:meth:`ForkServer.wait_ready`). With
    ``idle_exit_s``, a warm server: it outlives this process, ending once idle that long
    (:mod:`harness.jobs.warm`)."""
    if kind not in KINDS:
        raise ValueError(f"fork server kind: expected one of {KINDS}, got {kind!r}")
    path = folder / (name or f"{kind}.sock")
    # Threads are set per child; the server's torch must not start with a count of its own.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    # Not a command a user runs: started here alone, by its function.
    command = [sys.executable, "-c", _SERVE, "--socket", str(path)]
    warm = [] if idle_exit_s is None else ["--idle-exit", repr(float(idle_exit_s))]
    # A warm server may be retired (SIGUSR1) before it can say what that means: it starts with
    # the signal blocked (a mask outlives exec), and unblocks it once it has its handler.
    blocked = {signal.SIGUSR1} if idle_exit_s is not None else set()
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        process = subprocess.Popen(
            [*command, "--kind", kind, *warm],
            cwd=ROOT,
            env=env,
            # A warm server ends by itself, not when this process's end closes its input.
            stdin=subprocess.PIPE if idle_exit_s is None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # a failed preload's cause goes to PATH.failed
            start_new_session=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    return ForkServer(kind, path, process, interpreter_variables(env))


def stop_servers(servers: Sequence[ForkServer]) -> None:
    """Close each server's standard input: it kills what it still runs and exits. A server
    still preloading has no child of its own yet: its process group (its warm build with it)
    is killed at once."""
    started = [server for server in servers if server.process is not None]
    for server in started:
        process = server.process
        assert process is not None
        assert process.stdin is not None
        if not server.path.exists():
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            process.stdin.close()
    for server in started:
        process = server.process
        assert process is not None
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def fork_servers(kinds: Sequence[str]) -> Iterator[dict[str, ForkServer]]:
    """A fork server of each of ``kinds`` for the block: the test run's (shared, when
    :data:`SHARED_SERVERS_ENV` names the servers of this checkout), else started now, preloading
    side by side, and stopped at the block's end."""
    wanted = list(dict.fromkeys(kinds))
    shared = shared_servers(wanted)
    if shared is not None:
        yield shared
        return
    servers: dict[str, ForkServer] = {}
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-forkserver-") as folder:
        try:
            for kind in wanted:
                servers[kind] = start_server(kind, Path(folder))
            yield servers
        finally:
            stop_servers(list(servers.values()))


def shared_servers(kinds: Sequence[str]) -> dict[str, ForkServer] | None:
    """The servers of ``kinds`` that :data:`SHARED_SERVERS_ENV` names, if it names this
    checkout's (a server preloads this checkout's harness) and has each kind."""
    folder = Path(os.environ.get(SHARED_SERVERS_ENV) or "/nonexistent")
    try:
        root = (folder / "root").read_text()
        interpreter = json.loads((folder / "interpreter.json").read_text())
    except (OSError, ValueError):
        return None
    if root != str(ROOT) or not set(kinds) <= set(KINDS):
        return None
    servers = {}
    for kind in kinds:
        try:
            pid = int((folder / f"{kind}.pid").read_text())
        except (OSError, ValueError):
            return None
        servers[kind] = ForkServer(kind, folder / f"{kind}.sock", None, interpreter, pid)
    return servers


@contextlib.contextmanager
def shared_with_started_processes() -> Iterator[Path]:
    """Fork servers of every kind for the block, shared with every main job started inside it
    (its processes inherit :data:`SHARED_SERVERS_ENV`): a test run's, whose tests start dozens."""
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-forkservers-") as name:
        folder = Path(name)
        (folder / "root").write_text(str(ROOT))
        (folder / "interpreter.json").write_text(json.dumps(interpreter_variables(os.environ)))
        servers: list[ForkServer] = []
        before = os.environ.get(SHARED_SERVERS_ENV)
        try:
            for kind in KINDS:
                servers.append(start_server(kind, folder))
                assert servers[-1].process is not None
                # Whether it still runs, for the main jobs that wait for it to be ready.
                (folder / f"{kind}.pid").write_text(str(servers[-1].process.pid))
            os.environ[SHARED_SERVERS_ENV] = str(folder)
            yield folder
        finally:
            if before is None:
                os.environ.pop(SHARED_SERVERS_ENV, None)
            else:
                os.environ[SHARED_SERVERS_ENV] = before
            stop_servers(servers)


_SERVE = "import sys; from harness.jobs.forkserver import run_server; run_server(sys.argv[1:])"


def run_server(argv: Sequence[str]) -> None:
    """The server process: `--socket PATH --kind KIND` (see :func:`start_server`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to listen on")
    parser.add_argument("--kind", choices=KINDS, required=True, help="what to preload")
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a warm server: end after this long with nothing to do, not when standard input "
        "closes",
    )
    args = parser.parse_args(argv)
    serve(args.socket, args.kind, args.idle_exit)
