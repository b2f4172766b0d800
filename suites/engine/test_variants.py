"""The forward and greedy decoding on the variants that need an engine of their own: dynamic
resolution, video at T = 2, EVS (:mod:`suites.engine.test_forward` for what is checked)."""

from __future__ import annotations

import pytest

from suites.engine.conftest import Measure, Served
from suites.engine.test_forward import check_greedy, check_prompt_logprobs

pytestmark = pytest.mark.concern("engine")

#: Grouped by variant, so that each variant's engine serves its forms one after the other.
FORMS: dict[str, tuple[str, ...]] = {
    "images-dynamic": ("image-dynamic",),
    "videos-t2": ("video-t2",),
    "video-evs-t1": ("video-evs",),
}


#: The variant the harness's default test run builds an engine for (``nox -s tests``); its slow
#: tier (``nox -s tests-slow``) builds the others. The main job always runs all three.
DEFAULT_TIER = "images-dynamic"


@pytest.mark.parametrize(
    ("form", "paths"),
    [
        pytest.param(
            form, paths, id=form, marks=[] if form == DEFAULT_TIER else [pytest.mark.exhaustive]
        )
        for form, paths in FORMS.items()
    ],
)
def test_variant_prompt_logprobs_and_greedy_decoding(
    served: Served, form: str, paths: tuple[str, ...], measure: Measure
) -> None:
    check_prompt_logprobs(served, form, paths, measure)
    check_greedy(served, form, paths, measure)
