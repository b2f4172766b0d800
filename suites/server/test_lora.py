"""LoRA as the server serves it: adapters named at start (``--lora-modules NAME=DIR``) and
loaded and unloaded while it runs (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, the
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` endpoints), each request naming one by
its model name answered as the engine target answers the same request with the same adapter;
broken adapter folders refused with a 4xx naming what is wrong while the server keeps serving;
requests with and without adapters in flight together, each answered as alone."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.checkpoints.lora_adapters import (
    ADAPTERS_BY_NAME,
    BROKEN_ADAPTERS,
    adapter_folder,
    write_broken_adapter,
)
from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import engine_bound
from harness.problems import assert_no_problems
from harness.targets.engine import ENGINE_SPEC, Adapter, EngineOutput, Sampling, engine_prompt
from harness.targets.server import Server, ServerOptions
from suites.engine.conftest import SAMPLING
from suites.engine.test_lora import ADAPTER_IDS, DECODED_ONLY, LORA
from suites.server.conftest import Chat, server_request

pytestmark = pytest.mark.concern("server")

#: Served from the start; the others of :data:`ADAPTER_IDS` are loaded while the server runs.
AT_START = ("lm-projections", "rank-4")
LOADED_LATER = "rslora"
#: Each adapter's request: (form, adapter).
REQUESTS = (("text", "lm-projections"), ("images-pil", "rank-4"), ("text", LOADED_LATER))


def _folder(name: str) -> Path:
    return adapter_folder(ENGINE_SPEC, ADAPTERS_BY_NAME[name])


def lora_server_options() -> ServerOptions:
    return ServerOptions(
        LORA,
        lora_modules=tuple((name, _folder(name)) for name in AT_START),
        runtime_lora_updating=True,
        dev_mode=True,
    )


@pytest.fixture(scope="module")
def lora_server(chat: Chat) -> Iterator[Server]:
    """The LoRA server, stopped when the module ends (it holds an engine with LoRA slots)."""
    options = lora_server_options()
    yield chat.target.server(ENGINE_SPEC, options)
    chat.target.forget_server(ENGINE_SPEC, options)


def _engine_answer(chat: Chat, form: str, adapter: str | None) -> EngineOutput:
    """The engine target's answer (the same options) to ``form``'s rendered chat prompt with
    ``adapter``, alone."""
    request = chat.rendered(server_request(form))
    engine = chat.target.engine(ENGINE_SPEC, LORA)
    served = None if adapter is None else Adapter(adapter, ADAPTER_IDS[adapter], _folder(adapter))
    return engine.generate([engine_prompt(request)], SAMPLING, adapters=[served])[0]


def _post(server: Server, path: str, body: dict[str, str]) -> tuple[int, str]:
    """The status and the message of the answer (an error's own message where it is one)."""
    import httpx

    response = httpx.post(server.base_url + path, json=body, timeout=120)
    try:
        return response.status_code, str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.status_code, response.text


def _load(server: Server, name: str, folder: Path) -> tuple[int, str]:
    return _post(server, "/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})


def test_each_served_adapter_answers_as_the_engine(chat: Chat, lora_server: Server) -> None:
    status, text = _load(lora_server, LOADED_LATER, _folder(LOADED_LATER))
    assert status == 200, f"loading {LOADED_LATER} while serving: HTTP {status} {text}"
    listed = {m.id for m in lora_server.client().models.list().data}
    assert {*AT_START, LOADED_LATER} <= listed, f"/v1/models lists {sorted(listed)}"
    bound = engine_bound("batched-vs-alone").value
    problems = []
    for form, adapter in REQUESTS:
        served = lora_server.chat(server_request(form), SAMPLING, adapter=adapter)
        _, found = compare_answers(_engine_answer(chat, form, adapter), served, bound)
        problems += [f"{form} with {adapter}: {p}" for p in found]
        base = lora_server.chat(server_request(form), SAMPLING)
        assert base.tokens != served.tokens or base.token_logprobs != served.token_logprobs, (
            f"{form}: the answer with {adapter} is the base model's: the adapter was not applied"
        )
    assert_no_problems(problems, "against the engine with the same adapter: ")


def test_an_unloaded_adapter_is_no_longer_served(lora_server: Server) -> None:
    status, text = _load(lora_server, "attention-only", _folder("attention-only"))
    assert status == 200, f"loading attention-only: HTTP {status} {text}"
    lora_server.chat(server_request("text"), SAMPLING, adapter="attention-only")
    status, text = _post(lora_server, "/unload_lora_adapter", {"lora_name": "attention-only"})
    assert status == 200, f"unloading attention-only: HTTP {status} {text}"
    import openai

    with pytest.raises(openai.NotFoundError, match="attention-only"):
        lora_server.chat(server_request("text"), SAMPLING, adapter="attention-only")
    assert lora_server.healthy()


@pytest.mark.parametrize("kind", sorted(BROKEN_ADAPTERS))
def test_a_broken_adapter_is_refused_clearly_while_serving_goes_on(
    chat: Chat, lora_server: Server, kind: str
) -> None:
    folder = write_broken_adapter(
        ENGINE_SPEC, kind, Path(tempfile.mkdtemp(prefix=f"broken-{kind}-")), LORA.max_lora_rank
    )
    status, text = _load(lora_server, f"broken-{kind}", folder)
    named = BROKEN_ADAPTERS[kind]
    expected = _engine_answer(chat, "text", None)  # the base model, as the engine answers it
    after = lora_server.chat(server_request("text"), SAMPLING)
    _, lost = compare_answers(expected, after, engine_bound("batched-vs-alone").value)
    problems = [] if lora_server.healthy() else ["/health does not answer 200 afterwards"]
    problems += [f"the next request: {p}" for p in lost]
    if not 400 <= status < 500:
        problems.insert(0, f"HTTP {status} ({text[:300]}): expected a 4xx")
    elif named not in text:
        problems.insert(0, f"HTTP {status} ({text[:300]}): the message does not name {named}")
    assert_no_problems(problems, f"broken-{kind}: ")


def _together(
    lora_server: Server, mix: list[tuple[str, str | None]], sampling: Sampling
) -> list[str]:
    """``mix`` twice over, scheduled together, against each request alone: the problems."""
    alone = [lora_server.chat(server_request(f), sampling, adapter=a) for f, a in mix]
    with ThreadPoolExecutor(len(mix) * 2) as pool:
        with lora_server.scheduled_together(len(mix) * 2):
            futures = [
                pool.submit(lora_server.chat, server_request(f), sampling, adapter=a)
                for f, a in mix * 2
            ]
        together = [f.result() for f in futures]
    bound = engine_bound("batched-vs-alone").value
    problems = []
    for k, ((form, adapter), answer) in enumerate(zip(mix * 2, together, strict=True)):
        _, found = compare_answers(alone[k % len(mix)], answer, bound)
        problems += [f"request {k} ({form}, adapter {adapter}): {p}" for p in found]
    return problems


def test_adapter_and_base_requests_in_flight_together_answer_as_alone(
    lora_server: Server,
) -> None:
    mix: list[tuple[str, str | None]] = [
        ("text", "lm-projections"),
        ("text", None),
        ("text", "rank-4"),
        ("text", None),
    ]
    problems = _together(lora_server, mix, DECODED_ONLY)
    assert_no_problems(problems, "together against alone: ")


def test_adapter_requests_asking_for_prompt_logprobs_together_are_served(
    lora_server: Server,
) -> None:
    """Last in the module: where this fails, the server's engine is dead."""
    mix: list[tuple[str, str | None]] = [("text", "lm-projections"), ("text", "rank-4")]
    problems = _together(lora_server, mix, SAMPLING)
    assert_no_problems(problems, "together against alone: ")
