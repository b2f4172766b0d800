"""The language model's forward as the engine serves it: every prompt token's log-probability
against the fp32 reference's, for text and every request form of the catalogue, and greedy
decoding against the reference's choices (tie-aware: :mod:`harness.oracles.decoding`).

Bounds: :mod:`harness.oracles.engine_bounds`, calibrated by ``nemotron-vl-calibrate-engine``.
"""

from __future__ import annotations

import math

import pytest

from harness.oracles.decoding import greedy_agreement
from harness.oracles.engine_bounds import engine_bound, engine_tie_bound
from suites.engine.conftest import DECODED, FORM_PATHS, Measure, Served

pytestmark = pytest.mark.concern("engine")


def logprob_bound(paths: tuple[str, ...], statistic: str = "reference") -> float:
    """The widest of ``paths``' bounds of ``statistic`` (``reference``: the largest difference
    over a prompt's positions; ``reference-rms``: their root mean square)."""
    return max(engine_bound(f"{statistic} | {path}").value for path in paths)


def check_prompt_logprobs(
    served: Served, form: str, paths: tuple[str, ...], measure: Measure
) -> None:
    answer = served.answer(form)
    reference = served.reference(form, answer.tokens)
    positions, problem = reference.prompt_differences(answer.prompt_token_ids)
    assert problem is None, f"{form}: {problem}"
    missing = [
        i for i in range(1, len(answer.prompt_logprobs)) if answer.prompt_logprobs[i] is None
    ]
    assert not missing, (
        f"{form}: the engine gave no log-probability for {len(missing)} prompt tokens, first "
        f"at {missing[0]} (every token after the first has one)"
    )
    errors = {
        i: abs(got - want)
        for i in positions
        if (got := answer.prompt_logprobs[i]) is not None
        and (want := reference.prompt_logprobs[i]) is not None
    }
    assert len(errors) == len(positions), f"{form}: the reference gave no log-probability"
    bound, rms_bound = logprob_bound(paths), logprob_bound(paths, "reference-rms")
    worst = max(errors, key=errors.__getitem__)
    rms = math.sqrt(sum(e * e for e in errors.values()) / len(errors))
    measure(
        "prompt log-probabilities",
        {
            "largest_logprob_error": errors[worst],
            "at_position": worst,
            "rms_logprob_error": rms,
            "positions_compared": len(errors),
            "prompt_tokens": len(answer.prompt_token_ids),
            "bound": bound,
            "rms_bound": rms_bound,
        },
    )
    assert errors[worst] <= bound, (
        f"{form}: prompt token {worst}'s log-probability is {errors[worst]:.4g} nats from "
        f"the reference's, above the bound {bound:.4g} ({', '.join(paths)})"
    )
    assert rms <= rms_bound, (
        f"{form}: the prompt's log-probabilities are {rms:.4g} nats (root mean square) from "
        f"the reference's, above the bound {rms_bound:.4g} ({', '.join(paths)})"
    )


#: Greedy steps that must choose the reference's own token (of :data:`DECODED`): a divergence at
#: a tie is an honest rounding's, but a comparison of ties only (most top-2 margins of a
#: few-hundred-token vocabulary with random weights are under a nat) would prove nothing.
MIN_AGREED_STEPS = DECODED // 2


def check_greedy(served: Served, form: str, paths: tuple[str, ...], measure: Measure) -> None:
    answer = served.answer(form)
    reference = served.reference(form, answer.tokens)
    tie = engine_tie_bound(paths)
    agreement = greedy_agreement(answer.tokens, reference.greedy, reference.margins, tie)
    largest = agreement.largest_difference(answer.token_logprobs, reference.continuation_logprobs)
    measure(
        "greedy decoding",
        {
            **agreement.measured(),
            "largest_logprob_error": largest,
            "tie_bound": tie,
            "reference_margins": [round(m, 4) for m in reference.margins],
        },
    )
    assert agreement.problem is None, f"{form}: {agreement.problem}"
    assert agreement.agreed >= MIN_AGREED_STEPS, (
        f"{form}: greedy decoding chose the reference's token at {agreement.agreed} of "
        f"{agreement.compared} steps, the others ties (steps {list(agreement.ties)}, tie bound "
        f"{tie:.4g}): fewer than {MIN_AGREED_STEPS}, the comparison proves too little"
    )
    assert largest <= logprob_bound(paths), (
        f"{form}: a decoded token's log-probability is {largest:.4g} nats from the reference's "
        f"reading the same tokens, above the bound {logprob_bound(paths):.4g}"
    )


@pytest.mark.parametrize(("form", "paths"), list(FORM_PATHS.items()), ids=list(FORM_PATHS))
def test_prompt_logprobs_match_the_reference(
    served: Served, form: str, paths: tuple[str, ...], measure: Measure
) -> None:
    check_prompt_logprobs(served, form, paths, measure)


@pytest.mark.parametrize(("form", "paths"), list(FORM_PATHS.items()), ids=list(FORM_PATHS))
def test_greedy_decoding_matches_the_reference(
    served: Served, form: str, paths: tuple[str, ...], measure: Measure
) -> None:
    check_greedy(served, form, paths, measure)
