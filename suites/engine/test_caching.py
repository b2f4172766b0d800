"""The engine's caches and chunked prefill against plain serving, on the engine with prefix
caching and 64-token chunks (:data:`~suites.engine.conftest.SCHEDULED`): a long multimodal prompt
prefilled in chunks (boundaries inside and between placeholder runs), a repeated request read
from the prefix cache, two different images of one size kept apart; and repeated media from the
processor cache of the plain engine. Each compares the engine with itself (the same request
served without the cache or the chunking), within the measured ``chunked-vs-whole`` bound of
the request's paths (a chunk or a cache hit changes the shapes the kernels see, and Mamba's
state is carried across it), or ``batched-vs-alone`` where nothing is split."""

from __future__ import annotations

import pytest

from harness.inputs.media import pil_image
from harness.inputs.requests import Request
from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import (
    RUN_LOCALISED_PATHS,
    engine_bound,
    split_prefill_bounds,
)
from harness.problems import assert_no_problems
from harness.targets.engine import (
    DEFAULT_OPTIONS,
    ENGINE_SPEC,
    EngineError,
    EngineOptions,
    Sampling,
    engine_prompt,
)
from reference_impl.processor import ProcessorOutput
from suites.engine.conftest import (
    CHUNK,
    DECODED,
    FORM_PATHS,
    SCHEDULED,
    Measure,
    Served,
    form_request,
)

pytestmark = pytest.mark.concern("engine")

#: Greedy, decoded tokens' log-probabilities only: a request asking for prompt log-probabilities
#: never reads the prefix cache (vLLM's ``skip_reading_prefix_cache``).
NOT_FROM_THE_CACHE = Sampling(
    max_tokens=DECODED, logprobs=2, prompt_logprobs=None, read_prefix_cache=False
)
FROM_THE_CACHE = Sampling(
    max_tokens=DECODED, logprobs=2, prompt_logprobs=None, read_prefix_cache=True
)


def split(paths: tuple[str, ...]) -> float:
    """The bound of a prefill the scheduler split against one in one step, for a request whose
    media take ``paths``: of its decoded tokens, and of its prompt's positions outside the
    placeholder runs whose error is heavy-tailed inside them
    (:func:`~harness.oracles.engine_bounds.split_prefill_bounds`)."""
    return split_prefill_bounds(paths)[1]


#: The placeholder modality of each run-localised path.
RUN_MODALITY = {"image-static": "images"}


def run_bounds(form: str, processed: ProcessorOutput) -> dict[int, float]:
    """The bound of each prompt position inside the placeholder runs of ``form``'s
    run-localised paths (:data:`~harness.oracles.engine_bounds.RUN_LOCALISED_PATHS`)."""
    inside, _ = split_prefill_bounds(FORM_PATHS[form])
    localised = {RUN_MODALITY[p] for p in FORM_PATHS[form] if p in RUN_LOCALISED_PATHS}
    return {
        i: inside
        for p in processed.placeholders
        if p.modality in localised
        for i in range(p.start, p.start + p.length)
    }


#: Each form and where its chunk boundaries fall: inside placeholder runs (a video's frames cut
#: in two), and between them (in the text between items).
BOUNDARIES = {"mixed": ("inside", "between"), "video-t1": ("inside",)}


@pytest.mark.self_consistency("the prompt prefilled in chunks against in one step")
@pytest.mark.parametrize("form", list(BOUNDARIES))
def test_chunked_prefill_equals_unchunked_serving(
    served: Served, form: str, measure: Measure
) -> None:
    _, request = form_request(form)
    processed = served.oracle(form).process(request)
    runs = [range(p.start, p.start + p.length) for p in processed.placeholders]
    boundaries = range(CHUNK, len(processed.input_ids), CHUNK)
    inside = [b for b in boundaries if any(b in r and b != r.start for r in runs)]
    between = [b for b in boundaries if not any(b in r and b != r.start for r in runs)]
    found = {"inside": inside, "between": between}
    for where in BOUNDARIES[form]:
        assert found[where], f"{form}: the check needs a chunk boundary {where} placeholder runs"
    whole = served.answer(form)
    chunked = served.answer(form, SCHEDULED)
    bound, in_runs = split(FORM_PATHS[form]), run_bounds(form, processed)
    largest, problems = compare_answers(whole, chunked, bound, in_runs)
    measure(
        "chunked prefill",
        {
            "largest_logprob_difference": largest,
            "bound": bound,
            "bound_inside_image_runs": max(in_runs.values(), default=None),
            "boundaries_inside_runs": len(inside),
        },
    )
    assert_no_problems(problems, f"{form} prefilled in chunks of {CHUNK}: ")


@pytest.mark.self_consistency("a repeated request read from the prefix cache against its first")
def test_a_repeated_request_is_read_from_the_prefix_cache_and_answers_the_same(
    served: Served, measure: Measure
) -> None:
    _, request = form_request("mixed")
    engine = served.target.engine(ENGINE_SPEC, SCHEDULED, counted=True)
    assert engine.llm.reset_prefix_cache()
    first = engine.generate([engine_prompt(request)], FROM_THE_CACHE)[0]
    with engine.counted() as counted:
        again = engine.generate([engine_prompt(request)], FROM_THE_CACHE)[0]
    measure(
        "prefix cache",
        {"cached_tokens": again.num_cached_tokens, "prompt_tokens": len(again.prompt_token_ids)},
    )
    assert first.num_cached_tokens == 0, "the first request found a cache already filled"
    assert again.num_cached_tokens > 0, f"the repeated request read no prefix cache ({counted})"
    assert counted["vllm:prefix_cache_hits"] > 0, f"no prefix-cache hit counted ({counted})"
    _largest, problems = compare_answers(first, again, split(FORM_PATHS["mixed"]))
    assert_no_problems(problems, "the request read from the prefix cache: ")


def _image_request(seed: int) -> Request:
    return Request("Describe <image> in a few words, please.", images=[pil_image(60, 50, seed)])


@pytest.mark.self_consistency("each image's answer against the same request served fresh")
def test_two_images_of_one_size_are_kept_apart_by_the_caches(
    served: Served, measure: Measure
) -> None:
    fresh_engine = served.target.engine(ENGINE_SPEC, DEFAULT_OPTIONS)
    cached = served.target.engine(ENGINE_SPEC, SCHEDULED, counted=True)
    assert cached.llm.reset_prefix_cache()
    first, second = _image_request(101), _image_request(102)
    cached.generate([engine_prompt(first)], FROM_THE_CACHE)
    with cached.counted() as counted:
        answer = cached.generate([engine_prompt(second)], FROM_THE_CACHE)[0]
    fresh = fresh_engine.generate([engine_prompt(second)], FROM_THE_CACHE)[0]
    other = fresh_engine.generate([engine_prompt(first)], FROM_THE_CACHE)[0]
    processed = served.oracle("text").process(second)
    text_before_the_image = min(p.start for p in processed.placeholders)
    measure(
        "two images",
        {"cached_tokens": answer.num_cached_tokens, "text_before_the_image": text_before_the_image},
    )
    assert answer.num_cached_tokens <= text_before_the_image, (
        f"the second image's request read {answer.num_cached_tokens} cached tokens, past the "
        f"{text_before_the_image} tokens of text before its image: the first image's cache"
    )
    assert counted["vllm:mm_cache_hits"] == 0, "the second image was served from the first's cache"
    _, problems = compare_answers(fresh, answer, split(FORM_PATHS["images-pil"]))
    assert_no_problems(problems, "the second image, after the first: ")
    assert other.token_logprobs != answer.token_logprobs, (
        "the two images' answers are the same: the check cannot tell them apart"
    )


@pytest.mark.self_consistency("repeated media from the processor cache against its first")
def test_repeated_media_are_served_from_the_processor_cache_and_answer_the_same(
    served: Served, measure: Measure
) -> None:
    # The scheduling engine (built last: vLLM keeps the last engine's counters), its prefix
    # cache not read, so that only the processor cache serves the repeat.
    engine = served.target.engine(ENGINE_SPEC, SCHEDULED, counted=True)
    request = _image_request(103)
    first = engine.generate([engine_prompt(request)], NOT_FROM_THE_CACHE)[0]
    with engine.counted() as counted:
        again = engine.generate([engine_prompt(request)], NOT_FROM_THE_CACHE)[0]
    measure("processor cache", {"mm_cache_hits": counted["vllm:mm_cache_hits"]})
    assert counted["vllm:mm_cache_hits"] >= 1, f"the repeated image missed the cache ({counted})"
    _, problems = compare_answers(first, again, engine_bound("batched-vs-alone").value)
    assert_no_problems(problems, "the image served from the processor cache: ")


def test_prefix_caching_without_chunked_prefill_is_refused_with_the_reason(
    served: Served,
) -> None:
    """vLLM refuses prefix caching for this hybrid model unless its prefill is chunked (its
    Mamba cache mode "align"): a user gets that reason when the engine is built."""
    options = EngineOptions(enable_prefix_caching=True, enable_chunked_prefill=False)
    with pytest.raises(EngineError, match="Chunked prefill is required for mamba cache mode"):
        served.target.engine(ENGINE_SPEC, options)


#: Prefix caching with vLLM's default step budget: a prompt's prefill in one step.
PREFIX_CACHING = EngineOptions(enable_prefix_caching=True, enable_chunked_prefill=True)
#: A text of about 300 tokens: more than one of prefix caching's 128-token blocks.
LONG_PROMPT = Request(" ".join(f"tide{k}" for k in range(48)) + ".")


@pytest.mark.self_consistency("a prompt under prefix caching against the same without it")
def test_a_prompt_longer_than_a_block_is_served_under_prefix_caching(
    served: Served, measure: Measure
) -> None:
    """``--enable-prefix-caching`` as a user sets it, the step budget left at vLLM's default:
    a prompt of more than one KV block prefilled in one step."""
    plain = served.target.engine(ENGINE_SPEC, DEFAULT_OPTIONS)
    whole = plain.generate([engine_prompt(LONG_PROMPT)], NOT_FROM_THE_CACHE)[0]
    cached = served.target.engine(ENGINE_SPEC, PREFIX_CACHING)
    answer = cached.generate([engine_prompt(LONG_PROMPT)], NOT_FROM_THE_CACHE)[0]
    largest, problems = compare_answers(whole, answer, split(FORM_PATHS["text"]))
    measure(
        "long prompt",
        {"prompt_tokens": len(answer.prompt_token_ids), "largest_logprob_difference": largest},
    )
    assert_no_problems(problems, "the prompt under prefix caching: ")
