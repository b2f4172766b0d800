"""The server component's parts without vLLM: its options, the API bodies a request becomes and
the answers read back (against hand-written answers), and the process lifecycle (the health
wait, the log's tail, the whole group stopped, the port freed) on a stand-in server: a module
named as vLLM's API server that serves ``/health`` with the standard library and starts a child
of its own. The real server runs in ``suites/server`` on the ``vllm-engine`` target."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.inputs.media import video_clip
from harness.inputs.requests import Request
from harness.targets.engine.options import EngineOptions, Sampling
from harness.targets.server.options import DEV_MODE_ENV, RUNTIME_LORA_UPDATING_ENV, ServerOptions
from harness.targets.server.process import Server, ServerError, port_is_free
from harness.targets.server.requests import (
    ServerRequestError,
    chat_answer,
    chat_body,
    completion_answer,
    content_parts,
    png_bytes,
    streamed_chat_answer,
    tensor_base64,
    wav_bytes,
)


def test_options_refuse_what_vllm_serve_would_not_start_with(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ServerOptions\.engine\.enable_lora: expected True"):
        ServerOptions(lora_modules=(("a", tmp_path),))
    lora = EngineOptions(enable_lora=True)
    with pytest.raises(ValueError, match=r"lora_modules: expected unique names, got \['a', 'a'\]"):
        ServerOptions(lora, lora_modules=(("a", tmp_path), ("a", tmp_path)))
    with pytest.raises(ValueError, match="allowed_local_media_path: expected a folder"):
        ServerOptions(allowed_local_media_path=tmp_path / "absent")


def test_options_are_the_flags_and_variables_vllm_serve_takes(tmp_path: Path) -> None:
    options = ServerOptions(
        EngineOptions(enable_lora=True, max_loras=2),
        lora_modules=(("a", tmp_path),),
        allowed_local_media_path=tmp_path,
        runtime_lora_updating=True,
        trust_request_mm_kwargs=True,
        dev_mode=True,
    )
    args = options.cli_args()
    assert args[args.index("--lora-modules") + 1] == f"a={tmp_path}"
    assert args[args.index("--allowed-local-media-path") + 1] == str(tmp_path)
    assert args[args.index("--max-loras") + 1] == "2"
    assert {"--trust-remote-code", "--enforce-eager", "--trust-request-mm-kwargs"} <= set(args)
    assert "--enable-log-requests" in args
    assert options.environment() == {RUNTIME_LORA_UPDATING_ENV: "True", DEV_MODE_ENV: "1"}
    # vLLM's own default for prefix caching is no flag at all.
    assert "--no-enable-prefix-caching" in ServerOptions().cli_args()
    defaults = ServerOptions(EngineOptions(enable_prefix_caching=None)).cli_args()
    assert not [a for a in defaults if "prefix-caching" in a]


def test_media_travel_losslessly() -> None:
    import av
    from PIL import Image

    samples = np.random.default_rng(0).uniform(-1, 1, 1000).astype(np.float32)
    with av.open(io.BytesIO(wav_bytes(samples, 16000))) as container:
        stream = container.streams.audio[0]
        assert stream.rate == 16000
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    assert np.array_equal(decoded, samples)
    pixels = np.random.default_rng(1).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png_bytes(pixels)))), pixels)
    rows = torch.randn(3, 8)
    loaded = torch.load(io.BytesIO(base64.b64decode(tensor_base64(rows))), weights_only=True)
    assert torch.equal(loaded, rows)


def test_a_request_is_one_user_turn_its_items_after_its_text(tmp_path: Path) -> None:
    request = Request(
        "A <image> and <so_embedding>.",
        images=[np.zeros((4, 4, 3), np.uint8)],
        audios=[np.zeros(160, np.float32)],
    )
    parts = content_parts(request)
    assert [p["type"] for p in parts] == ["text", "image_url", "input_audio"]
    assert parts[0]["text"] == request.prompt
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[2]["input_audio"]["format"] == "wav"
    files = content_parts(request, tmp_path)
    assert [p["type"] for p in files] == ["text", "image_url", "audio_url"]
    assert all(
        Path(p[p["type"]]["url"].removeprefix("file://")).parent == tmp_path for p in files[1:]
    )
    embeds = content_parts(Request("A <image>.", images=torch.zeros(1, 6, 8)))
    assert [p["type"] for p in embeds] == ["text", "image_embeds"]
    body = chat_body(request, Sampling(max_tokens=3, logprobs=2, prompt_logprobs=1))
    assert (body["max_tokens"], body["top_logprobs"], body["prompt_logprobs"]) == (3, 2, 1)
    assert body["temperature"] == 0.0
    assert body["return_tokens_as_token_ids"] is True


def test_frames_without_a_file_are_refused_by_name() -> None:
    request = Request("What happens in <video>?", videos=[video_clip(2, 16, 16, 0)])
    with pytest.raises(ServerRequestError, match=r"videos\[0\]: the API takes video files"):
        content_parts(request)


#: A chat answer's decoded tokens as vLLM writes them (hand-written): the chosen token and its
#: top log-probabilities.
CHAT_ANSWER_CONTENT: list[dict[str, object]] = [
    {
        "token": "token_id:11",
        "logprob": -0.25,
        "top_logprobs": [
            {"token": "token_id:11", "logprob": -0.25},
            {"token": "token_id:3", "logprob": -1.75},
        ],
    },
    {
        "token": "token_id:12",
        "logprob": -0.5,
        "top_logprobs": [{"token": "token_id:12", "logprob": -0.5}],
    },
]
#: A chat answer as vLLM writes one (hand-written): two decoded tokens, a three-token prompt.
CHAT_ANSWER = {
    "prompt_token_ids": [5, 6, 7],
    "prompt_logprobs": [
        None,
        {"6": {"logprob": -1.5}, "9": {"logprob": -0.5}},
        {"7": {"logprob": -2.0}},
    ],
    "choices": [
        {
            "token_ids": [11, 12],
            "finish_reason": "length",
            "logprobs": {"content": CHAT_ANSWER_CONTENT},
        }
    ],
}


def test_answers_are_read_back_as_the_engines() -> None:
    answer = chat_answer(CHAT_ANSWER)
    assert answer.prompt_token_ids == [5, 6, 7]
    assert answer.prompt_logprobs == [None, -1.5, -2.0]
    assert (answer.tokens, answer.token_logprobs) == ([11, 12], [-0.25, -0.5])
    assert answer.runner_up_logprobs == [-1.75, None]
    content = CHAT_ANSWER_CONTENT
    chunks = [
        {"prompt_token_ids": [5, 6, 7], "choices": [{"token_ids": [], "logprobs": None}]},
        {"choices": [{"token_ids": [11], "logprobs": {"content": content[:1]}}]},
        {
            "choices": [
                {"token_ids": [12], "finish_reason": "length", "logprobs": {"content": content[1:]}}
            ]
        },
    ]
    streamed = streamed_chat_answer(chunks)
    assert (streamed.tokens, streamed.token_logprobs, streamed.finish_reason) == (
        [11, 12],
        [-0.25, -0.5],
        "length",
    )
    completion = completion_answer(
        {
            "choices": [
                {
                    "prompt_token_ids": [1, 2],
                    "prompt_logprobs": [None, {"2": {"logprob": -3.0}}],
                    "token_ids": [4],
                    "finish_reason": "length",
                    "logprobs": {
                        "token_logprobs": [-0.1],
                        "top_logprobs": [{"token_id:4": -0.1, "token_id:8": -0.9}],
                    },
                }
            ]
        }
    )
    assert completion.prompt_logprobs == [None, -3.0]
    assert (completion.tokens, completion.runner_up_logprobs) == ([4], [-0.9])
    broken = {**CHAT_ANSWER, "prompt_logprobs": [None, {"9": {"logprob": -0.5}}, None]}
    with pytest.raises(
        ServerRequestError, match=r"prompt_logprobs\[1\]: no entry for the prompt's token 6"
    ):
        chat_answer(broken)


#: A stand-in for vLLM's API server: ``/health`` after a delay, a child process of its own
#: (as the engine core is), and its arguments in its log.
STAND_IN = textwrap.dedent(
    """
    import http.server, os, subprocess, sys, time
    args = sys.argv[1:]
    print("stand-in server", " ".join(args), flush=True)
    if "--exit-at-once" in args:
        print("ValueError: the stand-in was told to fail", flush=True)
        sys.exit(4)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    time.sleep(float(os.environ.get("STAND_IN_DELAY", "0.5")))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    port = int(args[args.index("--port") + 1])
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    """The environment that makes ``python -m vllm.entrypoints.openai.api_server`` the
    stand-in."""
    package = tmp_path / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(STAND_IN)
    return {"PYTHONPATH": str(tmp_path)}


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_server_is_ready_on_health_and_stopped_with_its_whole_group(
    tmp_path: Path, stand_in: dict[str, str]
) -> None:
    server = Server.start(tmp_path, ServerOptions(), environment_added=stand_in, timeout_s=60)
    try:
        assert server.healthy()
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert f"--model {tmp_path}" in server.log_tail()
        assert "--host 127.0.0.1" in server.log_tail()
        child = int(server.log_tail().split("child ")[1].split()[0])
        assert _alive(child)
        assert os.getpgid(child) == server.process.pid  # the group is the server's
    finally:
        killed = server.stop()
    assert killed == []  # SIGTERM sufficed
    time.sleep(0.2)
    assert not _alive(server.process.pid)
    assert not _alive(child)
    assert port_is_free(server.port)


def test_a_server_that_exits_or_never_answers_fails_with_its_log(
    tmp_path: Path, stand_in: dict[str, str]
) -> None:
    options = ServerOptions()
    with pytest.raises(
        ServerError,
        match=r"(?s)exited with 4 before /health answered; the server's log ends:\n.*"
        r"ValueError: the stand-in was told to fail",
    ):
        Server.start(
            tmp_path,
            options,
            environment_added={**stand_in, "STAND_IN_DELAY": "0"},
            timeout_s=30,
            python=_failing_python(tmp_path),
        )
    with pytest.raises(ServerError, match=r"did not answer /health within 2 s"):
        Server.start(
            tmp_path, options, environment_added={**stand_in, "STAND_IN_DELAY": "60"}, timeout_s=2
        )


def _failing_python(tmp_path: Path) -> str:
    """A Python that runs the stand-in told to exit at once."""
    script = tmp_path / "python-failing"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" --exit-at-once\n')
    script.chmod(0o755)
    return str(script)


def test_a_servers_memory_counts_in_its_starters_group() -> None:
    """The supervisor's memory limit and the report's peak cover a server a check started in a
    session of its own: the descendants of the target's group count, whatever their group.
    Here a starter in a group of its own starts a holder of 300 MiB in another session."""
    from harness.jobs.processes import group_memory_bytes

    holder = "import time; x = bytearray(300 * 2**20); time.sleep(60)"
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', {holder!r}], start_new_session=True); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while group_memory_bytes(starter.pid) < 300 * 2**20:
            assert time.monotonic() < deadline, "the holder's 300 MiB never counted"
            time.sleep(0.2)
    finally:
        import psutil

        for child in psutil.Process(starter.pid).children(recursive=True):
            child.kill()
        starter.kill()
        starter.wait()
