"""Decoding carries the model's state: each decoded token's log-probability equals the same
token's when the whole sequence is sent again as one prompt (the Mamba convolution and SSM
states and the KV cache carried across steps, against one prefill). Both sides are the engine's
own: the check compares the engine with itself, within the measured ``decode-vs-prefill``
bound."""

from __future__ import annotations

import pytest

from harness.oracles.engine_bounds import engine_bound
from harness.targets.engine import DEFAULT_OPTIONS, ENGINE_SPEC, Sampling, token_prompt
from suites.engine.conftest import Measure, Served

pytestmark = pytest.mark.concern("engine")


@pytest.mark.self_consistency("decoded tokens against the same sequence sent as one prompt")
def test_decoded_logprobs_equal_the_sequence_sent_as_a_prompt(
    served: Served, measure: Measure
) -> None:
    answer = served.answer("text")
    engine = served.target.engine(ENGINE_SPEC, DEFAULT_OPTIONS)
    again = engine.generate(
        [token_prompt(answer.prompt_token_ids + answer.tokens[:-1])],
        Sampling(max_tokens=1, logprobs=2, prompt_logprobs=1),
    )[0]
    n = len(answer.prompt_token_ids)
    prefilled = again.prompt_logprobs[n:]
    assert len(prefilled) == len(answer.tokens) - 1
    assert all(p is not None for p in prefilled)
    errors = [
        abs(d - p) for d, p in zip(answer.token_logprobs, prefilled, strict=False) if p is not None
    ]
    bound = engine_bound("decode-vs-prefill").value
    measure("decoded against prefilled", {"largest_logprob_error": max(errors), "bound": bound})
    assert max(errors) <= bound, (
        f"a decoded token's log-probability is {max(errors):.4g} nats from the same token's in "
        f"one prefill of the sequence, above the bound {bound:.4g}: state lost across steps"
    )
