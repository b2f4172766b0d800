"""Bad input over HTTP, nothing lost: each malformed request gets a 4xx whose message names the
problem; meanwhile a request already in flight finishes with the answer it has alone, and
afterwards ``/health`` answers and a good request is served as before. Each case through the
official ``openai`` client (every one is a body it can carry), on the default server or, for
what a user must switch on (given embeddings, a request's own processor options) or may cap
(items per prompt), on the restricted one. A bounded hypothesis search of malformed bodies runs
the same way.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import engine_bound
from harness.problems import assert_no_problems
from harness.targets.engine import ENGINE_SPEC, EngineOutput, Sampling
from harness.targets.server import Server, chat_body
from harness.targets.server.requests import client_arguments, png_bytes, tensor_base64, wav_bytes
from suites.engine.conftest import SAMPLING
from suites.server.conftest import Chat, Measure, server_request

pytestmark = pytest.mark.concern("server")

#: The good request in flight during each bad one, and the one served after it.
GOOD = "text"


def _part(kind: str, payload: object) -> dict[str, Any]:
    return {"type": kind, kind: payload}


def _message(text: str, *parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def _png() -> bytes:
    return png_bytes(np.full((40, 60, 3), 128, dtype=np.uint8))


def _video_without_frames() -> bytes:
    """A Matroska file with a video stream and not one frame in it."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as container:
        stream = container.add_stream("mpeg4", rate=2)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
    return buffer.getvalue()


def _url(media_type: str, data: bytes) -> dict[str, str]:
    return {"url": f"data:{media_type};base64,{base64.b64encode(data).decode()}"}


@dataclass(frozen=True)
class BadInput:
    """A malformed request: its body's messages (or a whole body), the server it goes to, and
    what the refusal's message must name (a regular expression, case-insensitive)."""

    name: str
    body: Callable[[], dict[str, Any]]
    names: str
    restricted: bool = False


def _chat(
    *messages: dict[str, Any], text: str = "Look: <image>.", **extra: Any
) -> Callable[[], dict[str, Any]]:
    def body() -> dict[str, Any]:
        return {
            "model": "nemotron-vl",
            "messages": _message(text, *messages),
            "max_tokens": 2,
            **extra,
        }

    return body


CASES = (
    BadInput(
        "corrupt-base64-image",
        _chat(_part("image_url", {"url": "data:image/png;base64,@@@not-base64@@@"})),
        r"base64",
    ),
    BadInput(
        "truncated-image-file",
        lambda: _chat(_part("image_url", _url("image/png", _png()[: len(_png()) // 2])))(),
        r"truncated",
    ),
    BadInput(
        "video-without-frames",
        lambda: _chat(
            _part("video_url", _url("video/x-matroska", _video_without_frames())),
            text="What happens in <video>?",
        )(),
        r"video",
    ),
    BadInput(
        "empty-audio-clip",
        lambda: _chat(
            _part(
                "input_audio",
                {
                    "data": base64.b64encode(wav_bytes(np.zeros(0, np.float32), 16000)).decode(),
                    "format": "wav",
                },
            ),
            text="Hear <so_embedding>.",
        )(),
        r"no audio|empty",
    ),
    BadInput(
        "embeddings-of-the-wrong-width",
        lambda: _chat(
            _part("image_embeds", tensor_base64(torch.randn(6, ENGINE_SPEC.hidden_size // 2)))
        )(),
        rf"hidden dimension mismatch: got {ENGINE_SPEC.hidden_size // 2}, but model expects "
        rf"{ENGINE_SPEC.hidden_size}",
    ),
    BadInput(
        "embeddings-without-enable-mm-embeds",
        lambda: _chat(
            _part("image_embeds", tensor_base64(torch.randn(6, ENGINE_SPEC.hidden_size)))
        )(),
        r"enable-mm-embeds",
        restricted=True,
    ),
    BadInput(
        "more-images-than-limit-mm-per-prompt",
        lambda: _chat(
            *[_part("image_url", _url("image/png", _png()))] * 3,
            text="Look: <image>, <image> and <image>.",
        )(),
        r"at most 2 image",
        restricted=True,
    ),
    BadInput(
        "request-processor-options-not-trusted",
        lambda: _chat(
            _part("image_url", _url("image/png", _png())), mm_processor_kwargs={"max_num_tiles": 1}
        )(),
        r"trust-request-mm-kwargs",
        restricted=True,
    ),
    BadInput("unknown-content-part", _chat(_part("hologram", {"url": "x"})), r"hologram"),
    BadInput(
        "prompt-over-the-context",
        _chat(text=" ".join(f"rain{k}" for k in range(600))),
        r"maximum context length is 2048",
    ),
    BadInput(
        "adapter-never-loaded",
        lambda: {**_chat(text="Hello.")(), "model": "never-loaded"},
        r"never-loaded",
    ),
)


def _send(server: Server, body: dict[str, Any]) -> tuple[int, str]:
    """``body`` through the ``openai`` client: its status and message (200 and "" if served)."""
    import openai

    try:
        server.client().chat.completions.create(**client_arguments(body))
    except openai.APIStatusError as e:
        return e.status_code, str(e.message)
    except openai.APIConnectionError as e:
        return 0, f"no answer: {e}"
    return 200, ""


def _nothing_lost(
    chat: Chat, server: Server, expected: EngineOutput, bad: Callable[[], tuple[int, str]]
) -> tuple[int, str, list[str]]:
    """Send the bad request while a good one is in flight, then a good one: the bad one's
    status and message, and what was lost."""
    good = server_request(GOOD)
    lost: list[str] = []
    bound = engine_bound("batched-vs-alone").value
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(server.chat, good, SAMPLING)
        status, message = bad()
        try:
            _, problems = compare_answers(expected, in_flight.result(), bound)
            lost += [f"the request in flight: {p}" for p in problems]
        except Exception as e:
            lost.append(f"the request in flight failed: {type(e).__name__}: {e}")
    if not server.healthy():
        lost.append("/health does not answer 200 afterwards")
    try:
        _, problems = compare_answers(expected, server.chat(good, SAMPLING), bound)
        lost += [f"the next good request: {p}" for p in problems]
    except Exception as e:
        lost.append(f"the next good request failed: {type(e).__name__}: {e}")
    return status, message, lost


#: JSON values a malformed body may hold where a field was.
_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=2),
)
#: Where in a good chat body a malformed request differs.
_FIELDS = (
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "logprobs",
    "top_logprobs",
    "content",
    "part",
    "url",
)


def _malformed(field: str, junk: object) -> dict[str, Any]:
    body = chat_body(server_request("images-pil"), Sampling(max_tokens=2, prompt_logprobs=None))
    content = body["messages"][0]["content"]
    if field == "content":
        body["messages"][0]["content"] = junk
    elif field == "part":
        content[1] = junk
    elif field == "url":
        content[1] = {"type": "image_url", "image_url": {"url": junk}}
    else:
        body[field] = junk
    return body


#: Malformed bodies tried (each with a request in flight and one after: about 2 s).
MALFORMED_EXAMPLES = 15


@settings(max_examples=MALFORMED_EXAMPLES)
@given(field=st.sampled_from(_FIELDS), junk=_JUNK)
def test_malformed_bodies_get_a_4xx_or_an_answer_and_nothing_is_lost(
    chat: Chat, field: str, junk: object
) -> None:
    import httpx

    server = chat.server()
    body = _malformed(field, junk)

    def send() -> tuple[int, str]:  # raw HTTP: the client refuses some of these itself
        response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)
        return response.status_code, response.text

    status, message, lost = _nothing_lost(chat, server, chat.served(GOOD), send)
    problems = ([f"HTTP {status} {message[:300]!r}"] if status >= 500 or status == 0 else []) + lost
    assert_no_problems(problems, f"{field} = {junk!r}: ")


#: The default server's cases first, then the restricted one's: one server runs at a time.
ORDERED = sorted(CASES, key=lambda case: case.restricted)


@pytest.mark.parametrize("case", ORDERED, ids=[c.name for c in ORDERED])
def test_bad_input_gets_a_clear_4xx_and_nothing_is_lost(
    chat: Chat, case: BadInput, measure: Measure
) -> None:
    server = chat.restricted() if case.restricted else chat.server()
    expected = chat.restricted_answer(GOOD) if case.restricted else chat.served(GOOD)
    status, message, lost = _nothing_lost(
        chat, server, expected, lambda: _send(server, case.body())
    )
    measure(case.name, {"status": status, "message": message[:400]})
    problems = list(lost)
    if not 400 <= status < 500:
        problems.insert(0, f"HTTP {status} {message[:300]!r}: expected a 4xx")
    elif not re.search(case.names, message, re.IGNORECASE):
        said = f"HTTP {status} {message[:300]!r}"
        problems.insert(0, f"{said}: the message does not name the problem ({case.names})")
    assert not problems, f"{case.name}: " + "; ".join(problems) + server.tail() * bool(lost)
