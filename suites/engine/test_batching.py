"""Batching and preemption: a request inside a batch of mixed requests answers as it does alone,
and so does every request of a batch whose KV cache is too small to hold them all at once (the
scheduler preempts and recomputes). Both sides are the same engine's: the check compares it
with itself within the measured ``batched-vs-alone`` bound, and the preempted batch within
``chunked-vs-whole`` of each request's paths (a preempted request's prefill is computed again,
split anew)."""

from __future__ import annotations

import pytest

from harness.inputs.requests import Request
from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import engine_bound, engine_path_bound
from harness.problems import assert_no_problems
from harness.targets.engine import (
    DEFAULT_OPTIONS,
    ENGINE_SPEC,
    EngineOptions,
    EngineOutput,
    engine_prompt,
)
from suites.engine.conftest import (
    FORM_PATHS,
    SAMPLING,
    SCHEDULED,
    Measure,
    Served,
    form_request,
)

pytestmark = pytest.mark.concern("engine")

#: The batch: text, images, a video, audio and all of them mixed.
BATCH = ("text", "images-pil", "video-t1", "audios", "mixed", "text")
#: Four texts of 249 tokens (this tokenizer spells most words letter by letter), each its own:
#: two 128-token blocks each, a third once decoding crosses 256 tokens, more than the
#: scheduling engine's 4.5 blocks hold at once.
LONG_TEXTS = tuple(
    Request(" ".join(f"{word}{k}" for k in range(37)) + ".")
    for word in ("rain", "hill", "moss", "reed")
)


def _check_batch(
    served: Served,
    options: EngineOptions,
    comparison: str,
    extra: tuple[Request, ...],
    measure: Measure,
) -> list[EngineOutput]:
    engine = served.target.engine(ENGINE_SPEC, options)
    requests = [form_request(form)[1] for form in BATCH] + list(extra)
    names = list(BATCH) + [f"long text {k}" for k in range(len(extra))]
    alone = [served.answer(form, options) for form in BATCH]
    alone += [engine.generate([engine_prompt(r)], SAMPLING)[0] for r in extra]
    paths = [FORM_PATHS[form] for form in BATCH] + [FORM_PATHS["text"]] * len(extra)
    answers = engine.generate([engine_prompt(r) for r in requests], SAMPLING)
    bounds = [
        engine_path_bound(comparison, p).value
        if comparison == "chunked-vs-whole"
        else engine_bound(comparison).value
        for p in paths
    ]
    largest = 0.0
    problems = []
    for name, one, answer, bound in zip(names, alone, answers, bounds, strict=True):
        difference, found = compare_answers(one, answer, bound)
        largest = max(largest, difference)
        problems += [f"{name}: {p}" for p in found]
    measure(
        "batch",
        {
            "largest_logprob_difference": largest,
            "bound": max(bounds),
            "preemptions": sum(a.preemptions for a in answers),
        },
    )
    assert_no_problems(problems, "inside the batch: ")
    return answers


@pytest.mark.self_consistency("each request inside a mixed batch against the same alone")
def test_a_request_in_a_mixed_batch_answers_as_alone(served: Served, measure: Measure) -> None:
    _check_batch(served, DEFAULT_OPTIONS, "batched-vs-alone", (), measure)


@pytest.mark.self_consistency("each request of a preempted batch against the same alone")
def test_requests_preempted_for_a_small_kv_cache_answer_as_alone(
    served: Served, measure: Measure
) -> None:
    answers = _check_batch(served, SCHEDULED, "chunked-vs-whole", LONG_TEXTS, measure)
    preempted = sum(a.preemptions for a in answers)
    assert preempted > 0, (
        "the batch ran without a preemption: the KV cache is not small enough to test one"
    )
