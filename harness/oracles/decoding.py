"""Greedy decoding against the reference, tie-aware.

An engine's greedy token at step ``k`` is compared with the reference's own greedy choice after
the same ``k`` tokens (teacher forcing: the reference reads the engine's tokens). Where they
differ, the divergence is a tie only if the reference's top-2 margin there is within
``tie_bound`` nats: two candidates that close may swap under the engine's honest rounding. The
comparison stops at a tie (what follows depends on the other token) and the result says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class EngineAnswer(Protocol):
    """What :func:`compare_answers` reads of an answer
    (:class:`harness.targets.engine.EngineOutput` has it)."""

    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def prompt_logprobs(self) -> list[float | None]: ...
    @property
    def tokens(self) -> list[int]: ...
    @property
    def token_logprobs(self) -> list[float]: ...
    @property
    def runner_up_logprobs(self) -> list[float | None]: ...


@dataclass(frozen=True)
class Agreement:
    """How far an engine's greedy tokens follow the reference's: ``compared`` steps agreed;
    ``diverged_at`` the first step that did not (None: none); ``tie`` whether that step's
    reference margin (``margin``) was within the bound."""

    compared: int
    diverged_at: int | None
    tie: bool
    margin: float | None

    @property
    def problem(self) -> str | None:
        if self.diverged_at is None or self.tie:
            return None
        return (
            f"greedy token {self.diverged_at} differs from the reference's, whose top-2 margin "
            f"there is {self.margin:.4g} nats: above the tie bound, not a tie"
        )

    def largest_difference(self, engine: Sequence[float], reference: Sequence[float]) -> float:
        """The largest difference of the agreed steps' log-probabilities (0 for none)."""
        steps = zip(engine[: self.compared], reference[: self.compared], strict=True)
        return max((abs(a - e) for a, e in steps), default=0.0)

    def measured(self) -> dict[str, object]:
        return {
            "agreed_steps": self.compared,
            "diverged_at": self.diverged_at,
            "tie": self.tie,
            "margin_at_divergence": self.margin,
        }


def greedy_agreement(
    tokens: Sequence[int], greedy: Sequence[int], margins: Sequence[float], tie_bound: float
) -> Agreement:
    """The engine's ``tokens`` against the reference's choices ``greedy`` after each prefix of
    them, with the reference's top-2 ``margins`` there (all three as long)."""
    if not len(tokens) == len(greedy) == len(margins):
        raise ValueError(
            f"greedy_agreement: expected tokens, greedy and margins of one length, got "
            f"{len(tokens)}, {len(greedy)} and {len(margins)}"
        )
    for step, (token, choice, margin) in enumerate(zip(tokens, greedy, margins, strict=True)):
        if token != choice:
            return Agreement(step, step, margin <= tie_bound, margin)
    return Agreement(len(tokens), None, False, None)


def compare_answers(
    first: EngineAnswer, second: EngineAnswer, bound: float
) -> tuple[float, list[str]]:
    """Two answers of one engine (or two engines) to the same request, which must agree within
    ``bound`` nats: the same prompt, every prompt token's log-probability, the greedy tokens up
    to the first step where ``first``'s own top-2 margin is within twice the bound (a tie; never
    the first step, or no decoded step would be compared), and those tokens' log-probabilities.
    The largest difference, and the problems found."""
    problems: list[str] = []
    if first.prompt_token_ids != second.prompt_token_ids:
        return math.inf, ["the prompt token ids differ"]
    largest = 0.0
    for position, (a, b) in enumerate(
        zip(first.prompt_logprobs, second.prompt_logprobs, strict=True)
    ):
        if (a is None) != (b is None):
            problems.append(f"prompt token {position}: a log-probability in one answer only")
        elif a is not None and b is not None:
            largest = max(largest, abs(a - b))
    if len(first.tokens) != len(second.tokens):
        problems.append(f"{len(first.tokens)} tokens decoded against {len(second.tokens)}")
    for step, (a, b) in enumerate(zip(first.tokens, second.tokens, strict=False)):
        if a != b:
            runner_up = first.runner_up_logprobs[step]
            margin = math.inf if runner_up is None else first.token_logprobs[step] - runner_up
            if step == 0:
                problems.append(
                    f"greedy token 0: {a} against {b} (top-2 margin {margin:.4g} nats): no "
                    "decoded step agreed, so nothing of decoding was compared"
                )
            elif margin > 2 * bound:
                problems.append(
                    f"greedy token {step}: {a} against {b}, where the first answer's top-2 "
                    f"margin is {margin:.4g} nats (above twice the bound: not a tie)"
                )
            break
        largest = max(largest, abs(first.token_logprobs[step] - second.token_logprobs[step]))
    if largest > bound:
        problems.append(f"log-probabilities differ by up to {largest:.4g} nats, above {bound:.4g}")
    return largest, problems
