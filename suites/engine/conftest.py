"""The engine checks' fixtures: the ``vllm-engine`` target, and each request's answer from its
engine kept per request, variant and options (one ``LLM.generate`` serves every check that reads
that answer)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pytest

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.requests import Request
from harness.oracles.language_model import ReferenceLanguageModel, Scores
from harness.targets import Target
from harness.targets.engine import (
    DEFAULT_OPTIONS,
    ENGINE_SPEC,
    SCHEDULED_OPTIONS,
    EngineOptions,
    EngineOutput,
    EngineTarget,
    Sampling,
    engine_prompt,
)
from harness.targets.engine.target import engine_spec
from harness.targets.server.forms import TEXT as API_TEXT

#: Tokens each catalogued request decodes.
DECODED = 12
#: The sampling of the kept answers: greedy, top-2 of every decoded token, every prompt token's.
SAMPLING = Sampling(max_tokens=DECODED, logprobs=2, prompt_logprobs=1)
#: The engine with prefix caching, 64-token chunks and a KV cache small enough to preempt.
SCHEDULED = SCHEDULED_OPTIONS
#: Its chunk.
CHUNK = 64
#: A prompt with no media (the server's checks send it too).
TEXT = API_TEXT
#: Each form on the default variant and the paths its media take, whose bounds judge it (a form
#: with several paths takes the widest of its paths'; given embeddings are the text path's).
FORM_PATHS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "images-pil": ("image-static",),
    "video-t1": ("video-t1",),
    "audios": ("audio-hop-160",),
    "mixed": ("image-static", "video-t1", "audio-hop-160"),
    "video-audio-in-video": ("video-t1", "audio-in-video"),
    "image-embeds-stacked": ("text",),
    "video-embeds-list": ("text",),
}


def form_request(form: str) -> tuple[ModelSpec, Request]:
    """A catalogued form's request on the engine's width of its variant (``text``: :data:`TEXT`
    on the engine's default variant)."""
    if form == "text":
        return ENGINE_SPEC, TEXT
    catalogued = FORMS_BY_NAME[form]
    spec = engine_spec(catalogued.spec)
    return spec, catalogued.request_for(spec)


@dataclass
class Served:
    """Each request's answer from ``target``'s engines, kept (or the error it raised)."""

    target: EngineTarget
    _answers: dict[tuple[str, ModelSpec, EngineOptions], EngineOutput | Exception] = field(
        default_factory=dict
    )
    _scores: dict[tuple[str, ModelSpec, tuple[int, ...]], Scores] = field(default_factory=dict)
    _oracles: dict[ModelSpec, ReferenceLanguageModel] = field(default_factory=dict)

    def answer(self, form: str, options: EngineOptions = DEFAULT_OPTIONS) -> EngineOutput:
        """``form``'s request served alone with :data:`SAMPLING`."""
        spec, request = form_request(form)
        key = (form, spec, options)
        if key not in self._answers:
            engine = self.target.engine(spec, options)
            try:
                self._answers[key] = engine.generate([engine_prompt(request)], SAMPLING)[0]
            except Exception as e:  # kept: every check reading it fails with the same cause
                self._answers[key] = e
        answer = self._answers[key]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def oracle(self, form: str) -> ReferenceLanguageModel:
        """The fp32 reference language model of ``form``'s variant: the checks' oracle."""
        spec, _ = form_request(form)
        if spec not in self._oracles:
            self._oracles[spec] = ReferenceLanguageModel(
                checkpoint_folder(spec), spec, DEFAULT_OPTIONS.max_model_len
            )
        return self._oracles[spec]

    def reference(self, form: str, continuation: list[int]) -> Scores:
        """The reference's scores of ``form``'s request followed by ``continuation``."""
        spec, request = form_request(form)
        key = (form, spec, tuple(continuation))
        if key not in self._scores:
            self._scores[key] = self.oracle(form).scores(request, continuation)
        return self._scores[key]


class Measure:
    """What a check measured, by item, into its result (``record_property("measured")``, which
    the report lists per kind: these are ``engine``'s)."""

    #: The report's kind of these numbers.
    kind = "engine"

    def __init__(self, record_property: pytest.RecordProperty) -> None:
        self._record = record_property
        self._items: dict[str, dict[str, object]] = {}

    def __call__(self, item: str, numbers: Mapping[str, object]) -> None:
        self._items[item] = {"kind": self.kind, **numbers}
        self._record("measured", dict(self._items))


@pytest.fixture
def measure(record_property: pytest.RecordProperty) -> Measure:
    return Measure(record_property)


@pytest.fixture(scope="session")
def engine_target(target: Target) -> EngineTarget:
    """The ``vllm-engine`` target; the engine checks skip on a target without an engine."""
    if not isinstance(target, EngineTarget):
        pytest.skip(
            f"the engine checks serve requests through vLLM's LLM on its CPU build "
            f"(--target=vllm-engine); target {target.name!r} has no engine here"
        )
    return target


@pytest.fixture(scope="session")
def served(engine_target: EngineTarget) -> Iterator[Served]:
    """The answers, kept for the session; its engines stopped when it ends (before pytest's
    output closes: vLLM's processes log as they stop)."""
    yield Served(engine_target)
    engine_target.shutdown_engines()
