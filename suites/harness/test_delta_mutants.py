"""The derived parity bounds bite: each :data:`harness.mutation.file_mutants.DELTA` mutant of the
installed vLLM (a path's rows scaled by a few percent, RADIO's norm epsilon changed, one hidden
channel or one position off),
written at test time, fails the parity checks of the forms it reaches, by the statistic it
moves, while every item it moves stays under the old single bound (16 bf16 unit roundoffs,
6.25 %, which it would have passed); the installed file passes the same checks.

The elementwise mutants prove more: some item they move stays within its path's global bound, so
only the per-channel or per-row statistic sees it.

The runs share one vLLM import: each is a fork of this process (:mod:`harness.mutation.runner`).
"""

from __future__ import annotations

import pytest

from harness.mutation.file_mutants import DELTA, write_mutant
from harness.mutation.runner import SuiteRun
from harness.oracles.parity import BF16_BOUND
from suites.harness.helpers import (
    in_the_slow_tier,
    needs_vllm,
    run_installed_and_mutants,
    selected_params,
)

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

PARITY = "suites/conformance/test_parity.py::test_request_matches_the_reference[{}]"
#: Each mutant: the request forms whose parity checks it must fail, the words of the failure
#: (which statistic), and whether it is an elementwise shift that the global error misses.
EXPECTED: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "vision-rows-scaled-3pc": (
        ("images-pil", "video-t1", "videos-t2", "mixed"),
        "relative error",
        False,
    ),
    "vision-rows-scaled-4.5pc": (
        ("images-pil", "video-t1", "videos-t2", "mixed"),
        "relative error",
        False,
    ),
    "sound-rows-scaled-5pc": (("audios", "mixed"), "relative error", False),
    "radio-norm-eps-3e-5": (("images-pil",), "relative error", False),
    "vision-channel-scaled": (("images-pil", "video-t1"), "largest channel error", True),
    "vision-first-row-scaled": (("images-pil",), "largest row error", True),
}
FORMS = sorted({form for forms, _, _ in EXPECTED.values() for form in forms})
CHECKS = [PARITY.format(form) for form in FORMS]
UNMUTATED = "installed"


def test_every_delta_mutant_has_its_expectation():
    assert set(EXPECTED) == set(DELTA)


#: The shifts the default tier puts back, one the global error catches and one only an
#: elementwise statistic does; the slow tier puts back every one.
DEFAULT_TIER = ("vision-rows-scaled-3pc", "vision-first-row-scaled")


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, SuiteRun]:
    mutants = {
        name: [PARITY.format(form) for form in EXPECTED[name][0]]
        for name in selected_params(request, "name")
    }
    return run_installed_and_mutants(
        tmp_path_factory.mktemp("delta"), CHECKS, mutants, write_mutant
    )


def test_the_installed_file_passes_the_derived_bounds(runs):
    run = runs[UNMUTATED]
    assert not run.problems, f"{run.problems}\n{run.output[-3000:]}"
    assert run.outcomes("pass") == set(CHECKS), run.output[-3000:]


def _moved_items(measured: dict[str, dict[str, object]]) -> dict[str, dict[str, float]]:
    """The tower items of a check's measurements that exceed one of their bounds."""
    moved = {}
    for item, numbers in measured.items():
        if "global_bound" not in numbers:
            continue
        values = {k: float(v) for k, v in numbers.items() if isinstance(v, int | float)}
        if any(values[f"{s}_error"] > values[f"{s}_bound"] for s in ("global", "row", "channel")):
            moved[item] = values
    return moved


@pytest.mark.parametrize("name", in_the_slow_tier(sorted(EXPECTED), DEFAULT_TIER))
def test_a_small_numeric_shift_fails_the_derived_bounds(runs, name):
    forms, words, elementwise = EXPECTED[name]
    run = runs[name]
    assert not run.problems, f"{name}: {run.problems}\n{run.output[-3000:]}"
    checks = {PARITY.format(form) for form in forms}
    assert run.outcomes("fail") == checks, (
        f"{name} ({DELTA[name].description}) passes: {sorted(checks - run.outcomes('fail'))}"
    )
    only_elementwise = []
    for check in sorted(checks):
        outcome = run.outcome(check)
        assert words in outcome["reason"], f"{name}: {check} failed otherwise: {outcome['reason']}"
        moved = _moved_items(outcome.get("measured") or {})
        assert moved, f"{name}: {check} recorded no item over its bound"
        for item, values in moved.items():
            assert values["global_error"] < BF16_BOUND, (
                f"{name}: {check} {item} moved by {values['global_error']:.3g}, not under the old "
                f"bound {BF16_BOUND:.3g}: the mutant does not show the new bounds' worth"
            )
            if values["global_error"] <= values["global_bound"]:
                only_elementwise.append(f"{check} {item}")
    if elementwise:
        assert only_elementwise, (
            f"{name}: every moved item also exceeds its global bound; the mutant does not show "
            "what the elementwise statistics add"
        )
