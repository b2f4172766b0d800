"""Where a running check is (:mod:`harness.jobs.stacks`), and the supervisor's use of it: a
check past the derived limit is killed where a check that timed out was stuck, and keeps the
full limit elsewhere (:class:`harness.jobs.supervisor.Supervisor`). Expected frames are lines
of the programs written here, found by reading them (not by the code under test)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from harness.jobs.forkserver import fork_servers
from harness.jobs.processes import how_it_ended
from harness.jobs.results import read_results
from harness.jobs.stacks import Site, innermost_frame, stack_file, where
from harness.jobs.supervisor import Interrupt, Limits, Supervisor
from suites.harness.helpers import ROOT


def _line_of(text: str, path: Path) -> int:
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


STUCK = textwrap.dedent(
    """\
    import sys, threading, time
    from pathlib import Path
    from harness.jobs.stacks import answer_stack_requests

    def spin():
        while True: pass  # the loop

    def deadlock():
        held = threading.Lock()
        held.acquire()
        held.acquire()  # the deadlock

    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    answer_stack_requests(Path(sys.argv[2]))
    print("ready", flush=True)
    {"spin": spin, "deadlock": deadlock}[sys.argv[1]]()
    """
)


@pytest.mark.parametrize(("stuck", "line"), [("spin", "the loop"), ("deadlock", "the deadlock")])
def test_a_stuck_process_says_where_its_main_thread_is(
    tmp_path: Path, stuck: str, line: str
) -> None:
    """A loop and a deadlock alike answer with the main thread's frame, not another thread's."""
    program = tmp_path / "stuck.py"
    program.write_text(STUCK)
    progress = tmp_path / "progress"
    proc = subprocess.Popen(
        [sys.executable, str(program), stuck, str(progress)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        expected = Site(str(program), _line_of(line, program), stuck)
        # Asked until it is there (it may still be on its way into the loop): each answer is
        # where it is then; once there, it stays.
        deadline = time.monotonic() + 30
        found = where(proc.pid, progress)
        while found != expected and time.monotonic() < deadline:
            found = where(proc.pid, progress)
        assert found == expected
        assert where(proc.pid, progress) == expected  # asked again, the newest answer
        assert proc.poll() is None  # answering does not end it
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_keeps_no_answer_file_is_not_signalled(tmp_path: Path) -> None:
    """The signal's default action ends a process: one that never registered is not sent it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert where(proc.pid, tmp_path / "progress", timeout_s=0.5) is None
        stack_file(tmp_path / "progress").write_text("not an answer file\n")
        assert where(proc.pid, tmp_path / "progress", timeout_s=0.5) is None
        time.sleep(0.2)
        assert proc.poll() is None, how_it_ended(proc.returncode or 0)
    finally:
        proc.kill()
        proc.wait()


def test_a_dump_is_read_for_the_named_thread_outside_the_standard_library() -> None:
    """The named thread's frames only; a wait in the standard library (a lock, a queue) is where
    any thread waits, so the place is the innermost frame outside it."""
    threading_py = f"{sysconfig.get_paths()['stdlib']}/threading.py"
    dump = textwrap.dedent(
        f"""\
        Thread 0x00007f0000000002 (most recent call first):
          File "/x/elsewhere.py", line 320 in serve

        Current thread 0x00007f0000000001 (most recent call first):
          File "{threading_py}", line 327 in wait
          File "/usr/lib/python3.11/site-packages/vllm/parser.py", line 7 in parse
          File "/x/check.py", line 3 in test
        """
    )
    site = innermost_frame(dump, "0x00007f0000000001")
    assert site == Site("/usr/lib/python3.11/site-packages/vllm/parser.py", 7, "parse")
    assert str(site) == "vllm/parser.py:7 in parse"
    assert innermost_frame(dump, "0x00007f0000000003") is None
    only_waiting = f'Thread 0x01 (most recent call first):\n  File "{threading_py}", line 1 in w\n'
    assert innermost_frame(only_waiting, "0x01") == Site(threading_py, 1, "w")
    # A line cut short while faulthandler writes it is no frame.
    assert (
        innermost_frame('Thread 0x01 (most recent call first):\n  File "/x.py", line 3 in', "0x01")
        is None
    )


CHECKS = textwrap.dedent(
    """\
    import threading
    import time

    def hang():
        held = threading.Lock()
        held.acquire()
        held.acquire()  # the shared hang

    def test_a_hangs(target):
        hang()

    def test_b_slow_elsewhere(target):
        time.sleep(SLOW_S)  # honest, slow

    def test_c_hangs_the_same_way(target):
        hang()

    def test_d_passes(target):
        pass
    """
)
#: The start-up of each process has the full limit too: far above a forked process's start-up
#: on a loaded machine (at 20 s, a fresh clone's CI run, the other stream at full load, killed a
#: restarted process that had printed nothing yet; the same test under three CPU hogs here took
#: 62 to 67 s in all). The hang waits out this limit once, without a core.
FULL_S = 90.0
DERIVED_S = 1.0
SLOW_S = 3.5  # past the derived limit, well within the full one


@pytest.mark.exhaustive
def test_past_the_derived_limit_only_the_same_hang_is_killed(tmp_path: Path) -> None:
    """After the first hang (the full limit), a check past the derived limit somewhere else
    keeps the full limit and passes; the same hang again is killed at the derived limit; each
    timeout says where the check was stuck."""
    checks = tmp_path / "test_toy.py"
    checks.write_text(CHECKS.replace("SLOW_S", repr(SLOW_S)))
    # In a folder the target process makes (as the gate's sides' are made).
    results = tmp_path / "out" / "results.json"
    progress = tmp_path / "out" / ".progress"

    def command(resume: bool) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            *("-p", "harness.plugin", "-p", "no:randomly", "-p", "no:cacheprovider"),
            str(checks),
            f"--rootdir={tmp_path}",
            f"--results-json={results}",
            f"--progress-file={progress}",
            *(["--resume"] if resume else []),
        ]

    limits = Limits(
        check_timeout_s=FULL_S, derived_limit_factor=1.0, derived_limit_floor_s=DERIVED_S
    )
    with fork_servers(["torch"]) as servers:  # the test run's, when it has one
        supervised = Supervisor(
            command,
            results=results,
            progress=progress,
            limits=limits,
            cwd=ROOT,
            interrupt=Interrupt(),
            fork_server=servers["torch"],
        ).run()
    hang = f"test_toy.py:{_line_of('the shared hang', checks)} in hang"
    assert len(supervised.incidents) == 2, supervised
    assert all(incident["check"] for incident in supervised.incidents), supervised
    first, second = supervised.incidents
    assert (first["kind"], first["check"].split("::")[-1]) == ("timeout", "test_a_hangs")
    assert f"exceeded the check time limit of {FULL_S:g} s" in first["detail"]
    assert f"; stuck at {tmp_path}/{hang};" in first["detail"], first
    assert (second["kind"], second["check"].split("::")[-1]) == (
        "timeout",
        "test_c_hangs_the_same_way",
    )
    assert "exceeded the derived check time limit of" in second["detail"], second
    assert f"stuck where a check that timed out was, {tmp_path}/{hang}" in second["detail"]
    (past,) = supervised.past_derived_limit
    # Where it was depends on how far its process had got (its set-up, or the sleep).
    assert past.startswith(f"{checks.name}::test_b_slow_elsewhere: at "), past
    assert past.endswith("kept the full limit"), past
    written = read_results(results)
    assert written is not None
    outcomes = {c["id"].split("::")[-1]: c["outcome"] for c in written["checks"]}
    assert outcomes == {
        "test_a_hangs": "fail",
        "test_b_slow_elsewhere": "pass",
        "test_c_hangs_the_same_way": "fail",
        "test_d_passes": "pass",
    }, json.dumps(written["checks"], indent=1)
