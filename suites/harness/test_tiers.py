"""The two tiers of the harness's tests: ``nox -s tests`` keeps an end-to-end test of each command
the README documents, ``nox -s tests-slow`` runs the rest of the same machinery on more inputs
(``exhaustive``), and the workflow that runs the slow tier on a pull request watches every file
its tests live in."""

from __future__ import annotations

import fnmatch
import shlex
import subprocess
import sys

import yaml

from suites.harness.helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "tests-slow.yml"
#: The default tier's end-to-end test of each documented command (the issue that made the
#: tiers: the main job, the gate with both legs, a fault, a finding through the server).
END_TO_END = {
    "nemotron-vl-conformance": "suites/harness/test_kept.py::"
    "test_the_main_job_reuses_a_clean_run_until_an_input_changes",
    "nemotron-vl-gate (both legs)": "suites/harness/test_gate.py::"
    "test_the_engine_leg_judges_the_change_where_users_serve_it",
    "a fault in a check": "suites/harness/test_faults.py::"
    "test_a_fault_in_a_check_fails_it_and_the_run_goes_on[image-parser-segfaults]",
    "nemotron-vl-findings (server)": "suites/harness/test_findings.py::"
    "test_a_finding_reproduces_through_the_server",
}


def collected(*args: str) -> set[str]:
    """The test ids ``pytest --collect-only`` selects with ``args``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


def slow_tier_workflow() -> dict:
    document = yaml.safe_load(WORKFLOW.read_text())
    document["on"] = document.pop(True)  # YAML 1.1 reads the bare key `on` as True
    return document


def watched_paths() -> list[str]:
    """The patterns of the workflow's ``pull_request.paths`` filter."""
    return list(slow_tier_workflow()["on"]["pull_request"]["paths"])


def watched(path: str, patterns: list[str]) -> bool:
    # GitHub's `**` spans folders; fnmatch's `*` already does.
    return any(fnmatch.fnmatch(path, pattern.replace("**", "*")) for pattern in patterns)


def test_the_default_tier_runs_each_documented_command_end_to_end():
    files = sorted({test.split("::")[0] for test in END_TO_END.values()})
    default = collected(*files, "-m", "slow and not exhaustive")
    missing = {command: test for command, test in END_TO_END.items() if test not in default}
    assert not missing, f"not in the default tier: {missing}"


def test_every_module_with_a_slow_tier_test_is_watched_by_its_workflow():
    slow_tier = collected("suites", "-m", "exhaustive")
    assert slow_tier, "no test is marked exhaustive: the slow tier is empty"
    patterns = watched_paths()
    unwatched = sorted(
        {t.split("::")[0] for t in slow_tier if not watched(t.split("::")[0], patterns)}
    )
    assert not unwatched, f"{WORKFLOW.name} runs on a pull request that changes none of {unwatched}"


def test_every_watched_path_names_files_of_the_tree():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    patterns = watched_paths()
    assert len(patterns) >= 10, patterns
    empty = [p for p in patterns if not any(watched(f, [p]) for f in tracked)]
    assert not empty, f"path filters that match no file of the tree: {empty}"


def test_the_slow_tier_runs_nightly_on_demand_and_on_pull_requests_that_touch_it():
    workflow = slow_tier_workflow()
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch", "pull_request"}
    (schedule,) = workflow["on"]["schedule"]
    assert len(schedule["cron"].split()) == 5
    assert schedule["cron"].split()[2:] == ["*", "*", "*"]
    commands = [
        shlex.split(line)
        for job in workflow["jobs"].values()
        for step in job["steps"]
        for line in step.get("run", "").splitlines()
    ]
    assert ["nox", "-s", "tests-slow"] in commands, commands
