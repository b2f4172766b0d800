"""A fault in vLLM's engine can neither stall the main job nor leave a process behind.

The model file under test (a ``vllm-engine-file:`` target over the CPU build) deadlocks in the
image parser, which only the engine's worker runs (the model's forward): the check whose request
reaches it waits until the supervisor's time limit, which kills the target's whole process
group, the engine core and its worker included; the run goes on in a new process with the next
check, and no engine process of the run is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.jobs.runtimes import ENGINE_PYTHON_ENV, engine_python
from harness.mutation.file_mutants import write_mutant
from suites.harness.helpers import ROOT, needs_vllm

pytestmark = [pytest.mark.slow, pytest.mark.exhaustive, needs_vllm]

#: Its request reaches the image parser in the engine's worker (the forward).
HANGS = "suites/engine/test_forward.py::test_prompt_logprobs_match_the_reference[images-pil]"
#: A later module's check that builds no engine (vLLM refuses its options at configuration).
AFTER = (
    "suites/engine/test_seeds.py::"
    "test_a_minimal_layer_override_is_built_and_served_by_the_engine[registry-pattern]"
)
SELECTION = (
    "(test_prompt_logprobs_match_the_reference and images) or "
    "(test_a_minimal_layer_override_is_built_and_served_by_the_engine and registry)"
)
#: Above an honest engine build and request on a loaded 2-core machine (20 to 60 s).
CHECK_TIMEOUT_S = 120


#: Set in the main job's environment, which every process it starts inherits (vLLM's engine
#: processes are spawned with it): the processes of this run, told from any other's.
RUN_MARK = "NEMOTRON_VL_ENGINE_FAULT_RUN"


def engine_processes(mark: str) -> dict[int, str]:
    """The vLLM engine cores and workers (``VLLM::EngineCore``, ...) still running whose
    environment holds ``RUN_MARK=mark``."""
    found = {}
    wanted = f"{RUN_MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            if not command.startswith("VLLM::") or state == "Z":
                continue
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if wanted in environment:
            found[int(entry.name)] = command
    return found


def test_a_hanging_engine_times_out_its_check_and_leaves_no_process(tmp_path: Path) -> None:
    python = engine_python()
    if python is None:
        pytest.skip("no CPU build environment (.nox/engine): nox -s tests builds it")
    mark = uuid.uuid4().hex
    mutant = write_mutant("image-parser-deadlocks", tmp_path / "src")
    out = tmp_path / "reports"
    command = [
        *(sys.executable, "-m", "harness.jobs.conformance"),
        *("--target", f"vllm-engine-file:{mutant}", "--out", str(out)),
        *(f"--check-timeout={CHECK_TIMEOUT_S}", "--groups=1", "--max-restarts=2"),
        *("--", "-k", SELECTION),
    ]
    env = {**os.environ, ENGINE_PYTHON_ENV: str(python), RUN_MARK: mark}
    # A session of its own: whatever happens here, the job and every process it started are
    # stopped with their group.
    job = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output = job.communicate(timeout=900)[0][-3000:]
        report = json.loads((out / "conformance.json").read_text())
        (target,) = report["targets"]
        incidents = [(i["kind"], i["check"]) for i in target["incidents"]]
        assert ("timeout", HANGS) in incidents, (incidents, output)
        outcomes = {c["id"]: next(iter(c["results"].values()))["outcome"] for c in report["checks"]}
        # Its pinned cause, in the process started after the hang.
        assert outcomes.get(AFTER) == "xfail", (outcomes, output)
        assert job.returncode == 1, output
        deadline = time.monotonic() + 30
        while (left := engine_processes(mark)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"engine processes left by the run: {left}"
    finally:  # after the check for leftovers, which this must not hide
        # The job's own group, then any engine process of the run (each target runs in a
        # session of its own).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        for pid in engine_processes(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
