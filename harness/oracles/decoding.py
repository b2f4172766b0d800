"""Greedy decoding against the reference, tie-aware.

An engine's greedy token at step ``k`` is compared with the reference's own greedy choice after
the same ``k`` tokens (teacher forcing: the reference reads the engine's tokens). Where they
differ, the divergence is a tie only if the reference's top-2 margin there is within
``tie_bound`` nats: two candidates that close may swap under the engine's honest rounding. Both
sides read the engine's tokens, so a tie ends nothing: every step is compared, and the result
counts the steps that agreed and those that were ties.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    """How far an engine's greedy tokens follow the reference's: ``compared`` steps, of which
    ``agreed`` chose the reference's token and ``ties`` (step, reference margin) another within
    the tie bound; ``diverged_at`` the first step that did not agree (None: none) and
    ``margin`` the reference's margin there; ``wrong`` the first step that diverged above the
    tie bound and the margin there (None: none)."""

    compared: int
    agreed: int
    ties: tuple[tuple[int, float], ...]
    diverged_at: int | None
    margin: float | None
    wrong: tuple[int, float] | None = None

    @property
    def tie(self) -> bool:
        """Whether every divergence was a tie."""
        return self.wrong is None and self.diverged_at is not None

    @property
    def problem(self) -> str | None:
        if self.wrong is None:
            return None
        step, margin = self.wrong
        return (
            f"greedy token {step} differs from the reference's, whose top-2 margin there "
            f"is {margin:.4g} nats: above the tie bound, not a tie"
        )

    def largest_difference(self, engine: Sequence[float], reference: Sequence[float]) -> float:
        """The largest difference of the compared steps' log-probabilities (0 for none): both
        are the same token's after the same tokens."""
        steps = zip(engine[: self.compared], reference[: self.compared], strict=True)
        return max((abs(a - e) for a, e in steps), default=0.0)

    def measured(self) -> dict[str, object]:
        return {
            "compared_steps": self.compared,
            "agreed_steps": self.agreed,
            "tie_steps": [step for step, _ in self.ties],
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
    ties: list[tuple[int, float]] = []
    first: tuple[int, float] | None = None
    for step, (token, choice, margin) in enumerate(zip(tokens, greedy, margins, strict=True)):
        if token == choice:
            continue
        first = first or (step, margin)
        if margin > tie_bound:  # the engine chose otherwise where the reference was sure
            return Agreement(step + 1, step - len(ties), tuple(ties), *first, (step, margin))
        ties.append((step, margin))
    return Agreement(
        len(tokens),
        len(tokens) - len(ties),
        tuple(ties),
        None if first is None else first[0],
        None if first is None else first[1],
    )


def compare_answers(
    first: EngineAnswer,
    second: EngineAnswer,
    bound: float,
    prompt_bounds: Mapping[int, float] | None = None,
) -> tuple[float, list[str]]:
    """Two answers of one engine (or two engines) to the same request, which must agree within
    ``bound`` nats: the same prompt, every prompt token's log-probability (within
    ``prompt_bounds[i]`` for a position it names instead), the greedy tokens up to the first
    step where ``first``'s own top-2 margin is within twice the bound (a tie; never the first
    step, or no decoded step would be compared), and those tokens' log-probabilities. The
    largest difference, and the problems found."""
    problems: list[str] = []
    if first.prompt_token_ids != second.prompt_token_ids:
        return math.inf, ["the prompt token ids differ"]
    largest = 0.0
    wide: list[tuple[int, float, float]] = []  # positions past a bound of their own
    for position, (a, b) in enumerate(
        zip(first.prompt_logprobs, second.prompt_logprobs, strict=True)
    ):
        if (a is None) != (b is None):
            problems.append(f"prompt token {position}: a log-probability in one answer only")
        elif a is not None and b is not None:
            own = (prompt_bounds or {}).get(position)
            if own is None:
                largest = max(largest, abs(a - b))
            elif abs(a - b) > own:
                wide.append((position, abs(a - b), own))
    if wide:
        position, worst, own = max(wide, key=lambda w: w[1] / w[2])
        problems.append(
            f"{len(wide)} prompt tokens differ by more than their bound, token {position} by "
            f"{worst:.4g} nats, above {own:.4g}"
        )
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
    return max([largest, *(w[1] for w in wide)]), problems
