"""The server checks' fixtures: vLLM's OpenAI-compatible server of the ``vllm-engine`` target,
the requests it is sent (each catalogue form the API can carry), and each request's answer from
the server and from the target's engine, kept (one request serves every check that reads it).

The server's answer to a chat request is compared with the engine's (``vllm.LLM``, the same
options) for the prompt the chat template renders, as transformers renders it from the folder's
template: the API adds and loses nothing. The engine's own answers are checked against the
reference by ``suites/engine``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.checkpoints.cache import checkpoint_folder
from harness.inputs.requests import Request
from harness.oracles.language_model import ReferenceLanguageModel
from harness.targets.engine import (
    DEFAULT_OPTIONS,
    ENGINE_SPEC,
    EngineOutput,
    EngineTarget,
    Sampling,
    engine_prompt,
)
from harness.targets.server import Server, ServerOptions
from harness.targets.server.forms import API_FORMS, api_request
from suites.engine.conftest import SAMPLING, Measure, engine_target

__all__ = ["engine_target"]


class ServerMeasure(Measure):
    """What a server check sent and measured, into its result: the report lists these as the
    server's."""

    kind = "server"


@pytest.fixture
def measure(record_property: pytest.RecordProperty) -> ServerMeasure:
    return ServerMeasure(record_property)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed server check carries the tail of each running server's log into its result
    (the report's server section) and its output."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from harness.targets.server.process import running_servers

    tails = {f"log tail {s.url}": s.log_tail() for s in running_servers()}
    if not tails:
        return
    properties = dict(report.user_properties)
    measured = dict(properties.get("measured") or {})
    for name, tail in tails.items():
        measured[name] = {"kind": "server", "tail": tail}
        report.sections.append((f"vllm serve {name}", tail))
    report.user_properties = [(k, v) for k, v in report.user_properties if k != "measured"]
    report.user_properties.append(("measured", measured))


def server_request(form: str) -> Request:
    """A form's request as the server checks send it (:func:`api_request`)."""
    return api_request(form)


#: Two layers, Mamba then attention, in transformers 5's form of NemotronHConfig (the engine
#: checks' ``layers-block-type`` case), with vLLM's dummy weights, as a CI job serves a
#: minimal-layer model from the command line: ``--hf-overrides JSON --load-format dummy``.
MINIMAL_LAYERS = {"text_config": {"layers_block_type": ["linear_attention", "full_attention"]}}
#: The server a minimal-layer CI run starts, with what a user may leave off or cap: no given
#: embeddings (``--no-enable-mm-embeds``), two images per prompt, a request's own processor
#: options not trusted (vLLM's default).
RESTRICTED = ServerOptions(
    dataclasses.replace(
        DEFAULT_OPTIONS,
        hf_overrides=json.dumps(MINIMAL_LAYERS),
        load_format="dummy",
        enable_mm_embeds=False,
        limit_mm_per_prompt=(("image", 2),),
    )
)

#: The forms a chat request carries, each through every delivery of the API.
CHAT_FORMS = API_FORMS


@dataclass
class Chat:
    """The target's server and engine on the engine's default variant, each request's answers
    kept."""

    target: EngineTarget
    media_folder: Path
    _answers: dict[tuple[str, str], EngineOutput | Exception] = field(default_factory=dict)

    @property
    def options(self) -> ServerOptions:
        """The default server: the engine's default options, local media from
        :attr:`media_folder`, a request's own processor options trusted."""
        return ServerOptions(
            DEFAULT_OPTIONS,
            allowed_local_media_path=self.media_folder,
            trust_request_mm_kwargs=True,
        )

    def server(self) -> Server:
        return self.target.server(ENGINE_SPEC, self.options)

    def restricted(self) -> Server:
        """The server a CI job's minimal-layer run gets (:data:`RESTRICTED`)."""
        return self.target.server(ENGINE_SPEC, RESTRICTED)

    def restricted_answer(self, form: str) -> EngineOutput:
        """The restricted server's answer to ``form``'s chat request, alone."""
        return self._kept(
            ("restricted", form), lambda: self.restricted().chat(server_request(form), SAMPLING)
        )

    @functools.cached_property
    def oracle(self) -> ReferenceLanguageModel:
        """The fp32 reference of the default variant: its processor is the prompts' oracle."""
        return ReferenceLanguageModel(
            checkpoint_folder(ENGINE_SPEC), ENGINE_SPEC, DEFAULT_OPTIONS.max_model_len
        )

    @functools.cached_property
    def tokenizer(self) -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(checkpoint_folder(ENGINE_SPEC))

    def rendered(self, request: Request) -> Request:
        """``request`` with its prompt as one user turn through the folder's chat template, as
        transformers renders it (the generation prompt added)."""
        turn = [{"role": "user", "content": request.prompt}]
        text = self.tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return dataclasses.replace(request, prompt=str(text))

    def _kept(self, key: tuple[str, str], ask: Any) -> EngineOutput:
        if key not in self._answers:
            try:
                self._answers[key] = ask()
            except Exception as e:  # kept: every check reading it fails with the same cause
                self._answers[key] = e
        answer = self._answers[key]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def engine_answer(self, form: str) -> EngineOutput:
        """The engine's answer to ``form``'s rendered prompt, alone."""
        request = self.rendered(server_request(form))

        def ask() -> EngineOutput:
            engine = self.target.engine(ENGINE_SPEC, DEFAULT_OPTIONS)
            return engine.generate([engine_prompt(request)], SAMPLING)[0]

        return self._kept(("engine", form), ask)

    def served(self, form: str, delivery: str = "data-url") -> EngineOutput:
        """The server's answer to ``form``'s chat request, alone: media as data URLs
        (``data-url``), the same streamed (``stream``), or media as local files
        (``local-file``)."""
        request = server_request(form)

        def ask() -> EngineOutput:
            server = self.server()
            if delivery == "stream":
                return server.chat(request, SAMPLING, stream=True)
            folder = self.media_folder if delivery == "local-file" else None
            return server.chat(request, SAMPLING, media_folder=folder)

        return self._kept((delivery, form), ask)


def prompt_difference(
    tokenizer: Any, served: list[int], expected: list[int], whose: str
) -> str | None:
    """Where the server's prompt token ids first differ from ``whose`` (None: they do not), each
    side's token there by name."""
    if served == expected:
        return None
    pairs = zip(served, expected, strict=False)
    at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(served), len(expected)))

    def name(ids: list[int]) -> str:
        return repr(tokenizer.convert_ids_to_tokens(ids[at])) if at < len(ids) else "the end"

    return (
        f"the server's prompt has {len(served)} tokens, {whose} {len(expected)}; the first "
        f"difference at position {at}: {name(served)} where {whose} has {name(expected)}"
    )


def without_prompt_logprobs(answer: EngineOutput) -> EngineOutput:
    """``answer`` as a stream has it: no prompt log-probabilities."""
    return dataclasses.replace(answer, prompt_logprobs=[None] * len(answer.prompt_token_ids))


@pytest.fixture(scope="session")
def chat(engine_target: EngineTarget, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chat]:
    """The answers, kept for the session; the servers and engines stopped when it ends."""
    yield Chat(engine_target, tmp_path_factory.mktemp("server-media"))
    engine_target.shutdown_engines()


__all__ += [
    "CHAT_FORMS",
    "MINIMAL_LAYERS",
    "RESTRICTED",
    "Chat",
    "Measure",
    "Sampling",
    "server_request",
    "without_prompt_logprobs",
]
