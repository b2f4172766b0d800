"""``nemotron-vl-calibrate`` (harness.jobs.calibrate): what it measures, what it refuses, and that
the committed bounds pass vLLM on a weight seed the calibration never saw."""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.spec import ModelSpec
from harness.jobs.calibrate import (
    CALIBRATION_SEEDS,
    CHECK_SEEDS,
    NOT_SERVED,
    calibrate,
    check_bounds,
    main,
    table_json,
)
from harness.oracles.bounds import cell_key, parse_table
from harness.oracles.parity import BF16_BOUND
from harness.targets.reference.target import ReferenceTarget
from suites.harness.helpers import needs_vllm


def test_the_suites_calibration_and_check_seeds_never_overlap():
    assert 0 not in CALIBRATION_SEEDS  # the suites' folders: seed 0
    assert 0 not in CHECK_SEEDS
    assert not set(CALIBRATION_SEEDS) & set(CHECK_SEEDS)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seeds", "5-3"], "expected A <= B in '5-3'"),
        (["--seeds", "x"], "expected seeds as A-B or A, got 'x'"),
        (["--paths", "image-sideways"], "--paths: expected among"),
        (["--draws", "0"], "--draws: expected at least 1, got 0"),
    ],
)
def test_bad_arguments_are_refused_naming_them(argv, words, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_the_reference_against_itself_measures_nothing_in_fp32():
    """The reference served in fp32 is the oracle itself: every sample 0 (a calibration that
    measured anything there would be measuring the harness, not a target). Served in bf16 it
    computes in bf16 and measures its own rounding, below the analytic ceiling."""
    samples = calibrate(ReferenceTarget(), range(1, 2), 1, ["connector"], log=False)
    for saved in ("bfloat16", "float32"):  # --dtype auto is fp32 for the reference
        assert set(samples.cells[cell_key("connector", "float32", saved)]["global"]) == {0.0}
    bf16 = samples.cells[cell_key("connector", "bfloat16", "float32")]["global"]
    assert 0 < bf16[0] < BF16_BOUND


@needs_vllm
@pytest.mark.vllm
def test_vllm_is_calibrated_where_it_serves_and_says_why_where_it_does_not():
    from harness.targets.vllm import VllmTarget

    target = VllmTarget()
    samples = calibrate(target, range(1, 2), 1, ["image-static"], log=False)
    # One image request drawn (one or two images): one or two samples in the default cell.
    cell = samples.cells[cell_key("image-static", "bfloat16", "bfloat16")]
    assert 1 <= len(cell["global"]) <= 2
    assert all(0 < e < BF16_BOUND for e in cell["global"])
    # vLLM 0.33.0 builds the towers in the saved dtype, not the served one (a pinned deviation:
    # fixtures/deviations/vllm.toml): served fp16 from a bf16 folder, the request fails.
    why = samples.not_calibrated[cell_key("image-static", "float16", "bfloat16")]
    assert "c10::Half != c10::BFloat16" in why
    table = parse_table(table_json(samples, target, range(1, 2), 1), "new")
    assert table.bounds("image-static", torch.float16, "bfloat16").source.startswith(
        "not calibrated: vllm fails the path"
    )


@needs_vllm
@pytest.mark.vllm
def test_the_committed_bounds_pass_vllm_on_an_unseen_seed():
    from harness.targets.vllm import VllmTarget

    checks = check_bounds(VllmTarget(), range(CHECK_SEEDS.stop, CHECK_SEEDS.stop + 1))
    judged = {path: c for path, c in checks.items() if path != NOT_SERVED}
    assert {"image-static", "video-t1", "audio-hop-160", "connector"} <= set(judged)
    failures = [f for c in judged.values() for f in c.failures]
    assert not failures, failures
    # The forms vLLM fails for a pinned cause are listed, not judged.
    assert any("images-array" in f for f in checks[NOT_SERVED].failures)
    assert ModelSpec().checkpoint_dtype == "bfloat16"
