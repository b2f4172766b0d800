"""Checks that once passed a real failure, each shown failing now on a bug seeded in the
installed vLLM at test time (a copy of its file, served through ``--target=vllm-file:``):

- a refusal for ``max_model_len`` was accepted whatever the prompt's length: vLLM's admission
  made to refuse prompts a quarter of the context long now fails the drawn serving check, which
  asks the reference whether the prompt really exceeds the context;
- a covering-array variant whose tower shape was never calibrated was judged by the analytic
  ceiling (6.25 % in bf16): the relative error of a vision tower whose rows are 4.5 % off
  passed there, and fails its shape's calibrated bound now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.model_files import write_mutated_copy
from harness.mutation.file_mutants import write_mutant
from harness.oracles.parity import BF16_BOUND
from suites.harness.helpers import needs_vllm, run_suites

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

ADMISSION = Path("vllm/v1/engine/input_processor.py")
ADMISSION_TEST = "        if prompt_len > max_prompt_len:\n"
SERVING_PROPERTY = (
    "suites/conformance/test_serving_properties.py::"
    "test_any_configuration_serves_or_refuses_a_request_naming_the_option"
)


def test_a_refusal_of_a_prompt_that_fits_fails_the_drawn_serving_check(tmp_path: Path) -> None:
    def seed(source: str) -> str:
        assert source.count(ADMISSION_TEST) == 1
        return source.replace(ADMISSION_TEST, "        if prompt_len > max_prompt_len // 4:\n")

    mutant = write_mutated_copy(ADMISSION, tmp_path / "src", seed)
    run = run_suites(
        tmp_path / "run",
        f"--target=vllm-file:{mutant}",
        "-k",
        "test_any_configuration_serves_or_refuses",
        suite="suites/conformance/test_serving_properties.py",
    )
    result = run.outcome(SERVING_PROPERTY)
    assert result["outcome"] == "fail", result
    assert (
        "refused for max_model_len, but the reference's processed prompt has" in result["reason"]
    ), result


#: A variant with another tower shape than the default (32-pixel static tiles with MTP, a 32-wide
#: connector, 32 mel bins), whose images the mutant reaches.
SHAPED_VARIANT = "v2-static-audio-t2-mtp-hop128-no-conv-bias-no-thumbnail-registers"
PAIRWISE = (
    "suites/conformance/test_pairwise.py::"
    "test_a_variant_of_the_covering_array_serves_the_catalogue_as_the_reference"
)
#: A problem of the pairwise check: the form, the item, the statistic, its error and bound.
PROBLEM = re.compile(
    r"([\w-]+): ((?:image|video)\[\d+\]): (relative error|largest row error|largest channel "
    r"error) ([\d.e-]+) against the reference, bound ([\d.e-]+)"
)


def test_a_shaped_variant_4_5_percent_off_fails_its_calibrated_bounds(tmp_path: Path) -> None:
    mutant = write_mutant("vision-rows-scaled-4.5pc", tmp_path / "src")
    run = run_suites(
        tmp_path / "run",
        f"--target=vllm-file:{mutant}",
        "-k",
        SHAPED_VARIANT,
        suite="suites/conformance/test_pairwise.py",
    )
    assert run.results is not None, run.output[-3000:]
    [check] = [c for c in run.results["checks"] if c["id"].startswith(PAIRWISE)]
    assert check["outcome"] == "fail", check
    vision = [
        (form, item, statistic, float(error), float(bound))
        for form, item, statistic, error, bound in PROBLEM.findall(check["reason"])
    ]
    # The image items' relative errors: each under the old ceiling (16 bf16 unit roundoffs),
    # which would have passed them, and above the shape's calibrated bound. (Their largest
    # channel errors pass even the ceiling here, as at the default shape.)
    relative = [p for p in vision if p[1].startswith("image") and p[2] == "relative error"]
    assert relative, check["reason"]
    assert all(error < BF16_BOUND for *_, error, _ in relative), relative
    assert all(bound < error for *_, error, bound in relative), relative
