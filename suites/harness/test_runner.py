"""The fork runner: a run in a forked child reports its checks and leaves nothing behind."""

from __future__ import annotations

import pytest

from harness.checkpoints.cache import SHARED_FOLDERS_ENV
from harness.mutation.runner import SuiteJob, preload, run_many, run_one

CHECK = (
    "suites/conformance/test_weight_loading.py::"
    "test_every_parameter_is_loaded_from_the_checkpoint[default]"
)


@pytest.mark.slow
def test_a_forked_run_reports_its_checks_and_removes_its_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv(SHARED_FOLDERS_ENV)  # the case of a run without shared folders
    preload(vllm=False)
    run = run_one(SuiteJob("reference", "reference", (CHECK,), tmp_path / "run"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.outcomes("pass") == {CHECK}
    assert not run.problems
    # The child wrote the checkpoint folder it needed and removed it before exiting (a forked
    # child skips exit handlers: 600 MB a run were left behind before).
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_run_past_its_time_limit_is_killed_and_said_so(tmp_path):
    job = SuiteJob("slow", "reference", ("suites/conformance",), tmp_path / "slow")
    run = run_one(job, timeout_s=0.5)
    assert run.timed_out
    assert len(run.problems) == 1
    assert run.problems[0].startswith("killed after its time limit")


def test_a_jobs_own_time_limit_is_kept(tmp_path):
    job = SuiteJob("slow", "reference", ("suites/conformance",), tmp_path / "slow", timeout_s=0.5)
    [run] = run_many([job], timeout_s=600)
    assert run.timed_out
    assert run.wall_s < 60


@pytest.mark.parametrize(
    ("options", "message"),
    [({"parallel": 0}, "parallel: expected a positive"), ({"timeout_s": 0}, "timeout_s: expected")],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        next(run_many([], **options))
