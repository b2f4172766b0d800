"""The features check sees the audio front end: each :data:`harness.mutation.file_mutants.FRONT_END`
mutant of vLLM's ``ParakeetExtractor`` (the window, the mel filter bank, the normalisation, the
padding mask), written at test time, fails ``test_features.py`` on every audio form, for a
feature out of its bound or of the reference's shape; the installed file passes.

The runs share one vLLM import: each is a fork of this process (:mod:`harness.mutation.runner`).
"""

from __future__ import annotations

import pytest

from harness.mutation.file_mutants import FRONT_END, write_mutant
from harness.mutation.runner import SuiteRun
from suites.harness.helpers import (
    in_the_slow_tier,
    needs_vllm,
    run_installed_and_mutants,
    selected_params,
)

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.slow]

FEATURES = "suites/conformance/test_features.py"
#: The request forms whose items carry audio features from audio items alone (the tracks of
#: video files are pinned deviations of the unmutated vLLM, and so are the pixels of the mixed
#: form from vLLM 0.34.0 on: see fixtures/deviations/vllm.toml).
AUDIO_FORMS = ("audios", "audios-hop-128", "audios-no-conv-bias")
CHECKS = [f"{FEATURES}::test_features_match_the_reference[{form}]" for form in AUDIO_FORMS]
UNMUTATED = "installed"


#: The front-end bug the default tier puts back; the slow tier puts back every one.
DEFAULT_TIER = ("mel-scale-htk",)


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, SuiteRun]:
    mutants = dict.fromkeys(selected_params(request, "name"), CHECKS)
    return run_installed_and_mutants(
        tmp_path_factory.mktemp("front-end"), CHECKS, mutants, write_mutant
    )


def test_the_installed_front_end_passes(runs):
    run = runs[UNMUTATED]
    assert not run.problems, f"{run.problems}\n{run.output[-3000:]}"
    assert run.outcomes("pass") == set(CHECKS), run.output[-3000:]


@pytest.mark.parametrize("name", in_the_slow_tier(sorted(FRONT_END), DEFAULT_TIER))
def test_a_front_end_bug_fails_the_features_check(runs, name):
    run = runs[name]
    assert not run.problems, f"{name}: {run.problems}\n{run.output[-3000:]}"
    assert run.outcomes("fail") == set(CHECKS), (
        f"{name} ({FRONT_END[name].description}) passes: "
        f"{sorted(set(CHECKS) - run.outcomes('fail'))}"
    )
    for check in CHECKS:
        reason = run.outcome(check)["reason"]
        assert "input_audio_features" in reason or "feature_attention_mask" in reason, (
            f"{name}: {check} failed for another reason: {reason}"
        )
