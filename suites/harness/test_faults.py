"""No fault of a target can stall, pass or take down the main job.

Each fault is a mutated copy of the installed vLLM model file
(:data:`harness.mutation.file_mutants.FAULTS`), run by ``nemotron-vl-conformance`` on a few checks
in this order:

1. a LoRA metadata check that never reaches the image parser (passes before the fault);
2. ``test_each_form_reaches_its_modality[image_embeds]``: the image parser, where the fault is;
3. the same check for video embeddings and audio (pass in the restarted process).

The report must name the fault and the check, keep the results before it, carry on after it,
and exit non-zero. The time, memory and restart limits are set low so that each run takes
seconds; their defaults are for honest checks on slow machines. The main jobs the tests read
run once each, two at a time, and the one that waits on a deadlock beside them
(:func:`main_jobs`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.jobs.preload import process_running
from harness.jobs.results import REPORT_SCHEMA
from harness.jobs.supervisor import DERIVED_LIMIT_FLOOR_S
from harness.model_files import installed_model_file
from harness.mutation.file_mutants import FAULTS, write_mutant
from suites.harness.helpers import (
    ROOT,
    in_the_slow_tier,
    needs_vllm,
    one_thread_env,
    selected_tests,
    two_at_a_time,
    validate,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm]

BEFORE = (
    "suites/conformance/test_lora.py::"
    "test_lora_metadata_equals_the_language_models[embedding_modules]"
)
FORMS = "suites/conformance/test_routing.py::test_each_form_reaches_its_modality"
FAULTY = f"{FORMS}[image_embeds]"
AFTER = (f"{FORMS}[video_embeds]", f"{FORMS}[input_audio_features]")
SELECTION = "embedding_modules or (test_each_form_reaches_its_modality and not pixel)"
#: Well above the honest stretches of the selection, well below the default. Each target process
#: is forked from a server that imported vLLM (harness/jobs/forkserver.py), so no stretch imports
#: it: measured on a 2-core machine, a process's start-up up to 3 s and its slowest check 1.2 s,
#: the model build included (when each process imported vLLM, the first check of a restarted one
#: passed 45 s on a loaded 2-core machine without AVX-512; the limit was 90 s). Above the
#: derived limit's floor (DERIVED_LIMIT_FLOOR_S), so that the two are told apart.
CHECK_TIMEOUT_S = 45
#: The selection's process group peaks at 0.8 to 0.9 GiB honestly, forked from a fork server
#: that imported vLLM (2.7 to 3.1 GiB when each process was a new Python importing it); the
#: fault allocates 64 MiB at a time without bound. Not higher: the test run's other stream and
#: this module's other jobs share the machine's memory with it (at 6 GiB, the module peaked at
#: about 9 GiB of a 23 GiB machine).
MEMORY_LIMIT_GIB = 4


@dataclass
class MainJob:
    returncode: int
    output: str
    report: dict[str, Any] | None
    seconds: float
    markdown: str = ""

    @property
    def diagnosis(self) -> str:
        """What a failed assertion on this job shows: the target's incidents, how its processes
        started, its slowest check, the checks that kept the full limit past the derived one,
        and what the supervisor said."""
        if self.report is None:
            return f"no report written; output:\n{self.output[-3000:]}"
        target = self.target
        said = [line for line in self.output.splitlines() if "harness.jobs." in line]
        facts = {
            key: target.get(key)
            for key in ("incidents", "processes", "slowest_check", "past_derived_limit", "restarts")
        }
        return json.dumps(facts, indent=1) + "\n" + "\n".join(said[-20:])

    @property
    def target(self) -> dict[str, Any]:
        assert self.report is not None, f"no report written; output:\n{self.output[-3000:]}"
        (target,) = self.report["targets"]
        return target

    def outcome(self, check: str) -> dict[str, Any] | None:
        assert self.report is not None, f"no report written; output:\n{self.output[-3000:]}"
        for entry in self.report["checks"]:
            if entry["id"] == check:
                (result,) = entry["results"].values()
                return result
        return None


def main_job_command(
    target: str, out: Path, *options: str, selection: str = SELECTION
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness.jobs.conformance",
        "--target",
        target,
        "--out",
        str(out),
        f"--check-timeout={CHECK_TIMEOUT_S}",
        f"--memory-limit={MEMORY_LIMIT_GIB}",
        # One process per target: the incidents the tests count are one supervisor's (with
        # groups, a group the fault never reaches may still be running when it is stopped).
        "--groups=1",
        *options,
        "--",
        "-k",
        selection,
    ]


def read_report(out: Path) -> dict[str, Any] | None:
    path = out / "conformance.json"
    if not path.is_file():
        return None
    report: dict[str, Any] = json.loads(path.read_text())
    validate(report, REPORT_SCHEMA)
    return report


def run_main_job(fault: str, workdir: Path, *options: str, selection: str = SELECTION) -> MainJob:
    target = f"vllm-file:{write_mutant(fault, workdir / 'src')}"
    out = workdir / "reports"
    start = time.monotonic()
    proc = subprocess.run(
        main_job_command(target, out, *options, selection=selection),
        cwd=ROOT,
        env=one_thread_env(),  # two jobs run at once (below)
        capture_output=True,
        text=True,
        check=False,
        timeout=600,  # far above the limits set: the supervisor must end the run first
    )
    markdown = out / "conformance.md"
    return MainJob(
        proc.returncode,
        proc.stdout + proc.stderr,
        read_report(out),
        time.monotonic() - start,
        markdown.read_text() if markdown.is_file() else "",
    )


Job = tuple[str, tuple[str, ...]]  # a fault, and the main job's options
RESTARTS_RUN_OUT: Job = ("image-parser-exits-0", ("--max-restarts=0",))
#: Two checks that reach the image parser (image embeddings, then static pixels), so the parser
#: hangs twice: the second time under the limit derived after the first. A factor of 1: the
#: derived limit stays below CHECK_TIMEOUT_S even on a loaded machine (honest checks of 10 s).
#: The hang is a deadlock, which waits without using a core: the run waits out two limits, and
#: the other jobs run beside it (a loop, as the timeout test's, would hold a core 75 s).
TWO_HANGS_FACTOR = 1.0
TWO_HANGS: Job = (
    "image-parser-deadlocks",
    ("--max-restarts=3", f"--derived-limit-factor={TWO_HANGS_FACTOR}"),
)
TWO_HANGS_SELECTION = "embedding_modules or (test_each_form_reaches_its_modality and not video)"
PIXELS = f"{FORMS}[pixel_values_flat]"
#: The function of the model file the image parser's faults are put in (FAULTS).
PARSER = "_parse_and_validate_image_input"
AUDIO = f"{FORMS}[input_audio_features]"


def job_of(test: str, params: dict[str, Any]) -> Job | None:
    """The main job a test of this module reads, if any."""
    if test == "test_restarts_run_out_and_the_run_is_incomplete":
        return RESTARTS_RUN_OUT
    if test == "test_after_a_timeout_the_checks_run_under_a_derived_limit":
        return TWO_HANGS
    if test in (
        "test_a_fault_in_a_check_fails_it_and_the_run_goes_on",
        "test_a_module_that_cannot_import_stops_its_target_with_the_cause",
    ):
        return (params["fault"], ())
    return None


@pytest.fixture(scope="module")
def main_jobs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Job, MainJob]:
    """The main jobs of the selected tests of this module, made once: two at a time, and the
    one that waits on a deadlock beside them."""
    wanted: list[Job] = []
    for item in selected_tests(request):
        callspec = getattr(item, "callspec", None)
        job = job_of(item.originalname, callspec.params if callspec else {})
        if job is not None and job not in wanted:
            wanted.append(job)
    waiting = [job for job in wanted if job == TWO_HANGS]
    # The loop first: started last, it would run alone on one core while the other idles.
    using_cores = sorted(
        (job for job in wanted if job != TWO_HANGS), key=lambda job: job[0] != "image-parser-loops"
    )

    def run(job: Job) -> MainJob:
        fault, options = job
        selection = TWO_HANGS_SELECTION if job == TWO_HANGS else SELECTION
        return run_main_job(fault, tmp_path_factory.mktemp(fault), *options, selection=selection)

    with ThreadPoolExecutor(max_workers=1) as beside:
        waited = {job: beside.submit(run, job) for job in waiting}
        made = two_at_a_time(run, using_cores)
        return {**made, **{job: future.result() for job, future in waited.items()}}


def test_every_fault_is_a_mutant_of_the_installed_file(tmp_path: Path) -> None:
    """Each fault applies to the installed vLLM: its pattern is found exactly once (else
    ``MutationError``) and the file it writes differs from the installed one."""
    installed = installed_model_file().read_text()
    for name in FAULTS:
        assert write_mutant(name, tmp_path / name).read_text() != installed, name


IN_CHECK_FAULTS = {
    # fault: (incident kind, the check's outcome, words of its reason, exit status, target status)
    "image-parser-loops": (
        "timeout",
        "fail",
        f"exceeded the check time limit of {CHECK_TIMEOUT_S} s",
        1,
        "failed",
    ),
    "image-parser-allocates": (
        "memory",
        "fail",
        f"over the memory limit of {MEMORY_LIMIT_GIB} GiB",
        1,
        "failed",
    ),
    "image-parser-exits-0": (
        "crash",
        "error",
        "the target process died during this check: exited with status 0",
        2,
        "crashed",
    ),
    "image-parser-segfaults": (
        "crash",
        "error",
        "the target process died during this check: killed by SIGSEGV",
        2,
        "crashed",
    ),
}


#: The fault the default run injects (a crash: the restart and the incident it proves are those
#: every fault goes through); the slow tier injects every one.
DEFAULT_TIER_FAULT = "image-parser-segfaults"


@pytest.mark.parametrize("fault", in_the_slow_tier(sorted(IN_CHECK_FAULTS), [DEFAULT_TIER_FAULT]))
def test_a_fault_in_a_check_fails_it_and_the_run_goes_on(
    main_jobs: dict[Job, MainJob], fault: str
) -> None:
    kind, outcome, words, status, target_status = IN_CHECK_FAULTS[fault]
    job = main_jobs[(fault, ())]
    assert job.returncode == status, job.diagnosis
    assert job.target["status"] == target_status, job.diagnosis
    assert len(job.target["incidents"]) == 1, job.diagnosis
    (incident,) = job.target["incidents"]
    assert (incident["kind"], incident["check"]) == (kind, FAULTY), incident
    if kind == "timeout":  # where it was stuck: the fault's function in the changed file
        assert re.search(r"stuck at \S+/nano_nemotron_vl\.py:\d+ in " + PARSER, incident["detail"])
    assert job.target["restarts"] == 1
    # The check before the fault kept its result; the faulty one names the fault; the checks
    # after it ran in a restarted process.
    assert (job.outcome(BEFORE) or {}).get("outcome") == "pass", job.outcome(BEFORE)
    faulty = job.outcome(FAULTY)
    assert faulty is not None
    assert faulty["outcome"] == outcome, faulty
    assert words in faulty["reason"], faulty
    assert "the run went on from the next check" in faulty["reason"], faulty
    # Recorded by the plugin of the restarted process (the one writer of results), with what
    # the check runs on and its serving configuration, as any other check.
    assert (faulty["runs_on"], faulty["serving"]) == ("real model", "default"), faulty
    for check in AFTER:
        result = job.outcome(check)
        assert result is not None, check
        assert result["outcome"] == "pass", (check, result)
    assert f"**{kind}** in `{FAULTY}`" in job.markdown


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("import-raises", "RuntimeError: fault injected at import"),
        pytest.param("syntax-error", ":10: syntax error: ", marks=pytest.mark.exhaustive),
    ],
)
def test_a_module_that_cannot_import_stops_its_target_with_the_cause(
    main_jobs: dict[Job, MainJob], fault: str, cause: str
) -> None:
    job = main_jobs[(fault, ())]
    assert job.returncode == 2, job.output[-3000:]
    assert job.target["status"] == "could not run"
    assert cause in job.target["problem"], job.target["problem"]
    assert not job.target["incidents"]


@pytest.mark.exhaustive
def test_restarts_run_out_and_the_run_is_incomplete(main_jobs: dict[Job, MainJob]) -> None:
    job = main_jobs[RESTARTS_RUN_OUT]
    assert job.returncode == 2, job.output[-3000:]
    assert job.target["status"] == "crashed"
    kinds = [i["kind"] for i in job.target["incidents"]]
    assert kinds == ["crash", "gave up"], job.target["incidents"]
    assert (
        f"stopped after 0 restarts; {len(AFTER)} checks were not run"
        in (job.target["incidents"][1]["detail"])
    )
    assert all(job.outcome(check) is None for check in AFTER)
    # No process ran after the last fault: one recorded the stopped check alone.
    faulty = job.outcome(FAULTY)
    assert faulty is not None
    assert (faulty["outcome"], faulty["runs_on"]) == ("error", "real model"), faulty


@pytest.mark.exhaustive
def test_after_a_timeout_the_checks_run_under_a_derived_limit(
    main_jobs: dict[Job, MainJob],
) -> None:
    """A hang on a path many checks share (here a deadlock) costs one full limit, then a short
    one per check: after the first timeout each check's limit is --derived-limit-factor times
    the slowest honest check seen (at least DERIVED_LIMIT_FLOOR_S, at most --check-timeout), and
    the report says so. The honest check after the hangs still passes under it."""
    job = main_jobs[TWO_HANGS]
    assert job.returncode == 1, job.diagnosis
    assert len(job.target["incidents"]) == 2, job.diagnosis
    first, second = job.target["incidents"]
    assert (first["kind"], first["check"]) == ("timeout", FAULTY), first
    assert (second["kind"], second["check"]) == ("timeout", PIXELS), second
    assert f"exceeded the check time limit of {CHECK_TIMEOUT_S:g} s" in first["detail"]
    # The second hang's limit, from the slowest honest check seen before the first one.
    basis = re.search(r"when a check timed out, ([\d.]+) s", second["detail"])
    assert basis is not None, second
    slowest = float(basis.group(1))
    assert slowest <= job.target["slowest_check"]["wall_s"]  # the run's slowest, all checks
    derived = round(min(CHECK_TIMEOUT_S, max(DERIVED_LIMIT_FLOOR_S, TWO_HANGS_FACTOR * slowest)), 2)
    assert f"exceeded the derived check time limit of {derived:g} s" in second["detail"]
    # Killed at the derived limit because it was stuck where the first hang was.
    stuck = re.search(r"stuck at (\S+ in \w+);", first["detail"])
    assert stuck is not None, first
    assert f"stuck where a check that timed out was, {stuck.group(1)};" in second["detail"]
    assert second["at_s"] - first["at_s"] < CHECK_TIMEOUT_S + 30  # a restart, then the limit
    assert (job.outcome(AUDIO) or {}).get("outcome") == "pass", job.outcome(AUDIO)
    reported = job.target["derived_check_timeout_s"]
    assert f"derived limit of {reported:g} s" in job.markdown


def test_an_interrupted_run_still_writes_its_report(tmp_path: Path) -> None:
    """SIGTERM (as CI sends at its own time limit) while a check loops: the report keeps the
    check that finished, names the one that was running, and no target process is left."""
    target = f"vllm-file:{write_mutant('image-parser-loops', tmp_path / 'src')}"
    out = tmp_path / "reports"
    proc = subprocess.Popen(
        main_job_command(target, out, "--check-timeout=600"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    progress = next_progress_file(out)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if progress() == FAULTY:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"the looping check never started; output:\n{proc.communicate()[0][-3000:]}")
    time.sleep(1.0)  # inside the loop now
    children = target_processes(proc.pid)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output[-3000:]
    job = MainJob(proc.returncode, output, read_report(out), 0.0)
    assert job.target["status"] == "interrupted"
    (incident,) = job.target["incidents"]
    assert (incident["kind"], incident["check"], incident["detail"]) == (
        "interrupted",
        FAULTY,
        "SIGTERM",
    )
    assert (job.outcome(BEFORE) or {}).get("outcome") == "pass", job.outcome(BEFORE)
    assert children, "the target's pytest process was not found while it ran"
    for pid in children:
        assert not process_running(pid), f"target process {pid} outlived the interrupted run"


def next_progress_file(out: Path) -> Any:
    def read() -> str:
        # The progress file itself, not its siblings (PROGRESS.stack, PROGRESS.stopped.json).
        for path in out.glob(".progress-*"):
            if path.suffix in (".stack", ".json"):
                continue
            try:
                return path.read_text().strip()
            except OSError:
                return ""
        return ""

    return read


def target_processes(main_job: int) -> list[int]:
    """Processes holding a pipe the main job reads, beyond its own standard streams: its targets'
    pytest processes (forked from a fork server or started new; pytest's capture moves their
    output pipe off descriptor 1 while a check runs) and whatever they started."""
    pipes = set()
    for fd in os.listdir(f"/proc/{main_job}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{main_job}/fd/{fd}")
            if int(fd) > 2 and link.startswith("pipe:"):
                pipes.add(link)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (main_job, os.getpid()):
            continue
        with contextlib.suppress(OSError):
            links = {
                os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")
            }
            if links & pipes:
                found.append(int(entry))
    return found
