"""The fork runner: a run in a forked child reports its checks and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.checkpoints.cache import SHARED_FOLDERS_ENV
from harness.model_files import MODEL_FAMILY_MODULES
from harness.mutation.runner import SuiteJob, preload, run_many, run_one
from suites.harness.helpers import ROOT, needs_vllm

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


#: Run in a fresh process, whose imports before the call are known (in a test process, earlier
#: tests may have imported everything a build needs already).
BUILD_IMPORTS_SCRIPT = """
import json, sys, torch
from harness.jobs import preload
preload.WARM_BUILD_LIMIT_S = 240  # 3 s idle; a bound for a hang, not a timing
# The parent's OpenMP pool started before the fork: a child that used it hung.
torch.set_num_threads(2)
matrix = torch.randn(512, 512)
(matrix @ matrix).sum()
before = set(sys.modules)
found = preload.modules_a_build_imports()
print(json.dumps({"found": found, "new_in_parent": sorted(set(sys.modules) - before),
                  "already_imported": sorted(set(found) & before)}))
"""


@pytest.mark.slow
@needs_vllm
def test_what_a_build_imports_is_found_in_a_child_and_excludes_the_models_own():
    """The parent imports what a build imports lazily, found by one build in a forked child: no
    model is built in the parent (it imports nothing itself), and the model's own modules
    (which each child imports again from its mutant files) are not among them."""
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_IMPORTS_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    found = result["found"]
    assert found, "a build imports vLLM's kernels and layers as it goes: none found"
    assert not [n for n in found if n.startswith(tuple(MODEL_FAMILY_MODULES))]
    assert result["already_imported"] == [], "only modules the parent had not imported"
    assert result["new_in_parent"] == [], "the parent imported nothing itself"
