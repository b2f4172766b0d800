"""Warm fork servers (``--keep-warm``, :mod:`harness.jobs.warm`): kept between main jobs, used by
the next job while they are what it would start, retired once a file they imported changes, gone
once idle.

The servers here are real ``torch`` servers (each preloads in about 2 s) in a folder of the test's
own, so that no server of the developer's is touched; each test retires what it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT
from harness.jobs.forkserver import ForkServer, loaded_files_path
from harness.jobs.preload import process_running
from harness.jobs.warm import WARM_SERVERS_ENV, server_key, warm_folder, warm_servers
from suites.harness.test_forkserver import CHECKS, environment, output_of, session


@pytest.fixture
def folder() -> Iterator[Path]:
    """The warm servers' folder of one test (short: a socket's path has at most 107 bytes,
    which pytest's temporary folders exceed); what a test leaves there is ended at its end."""
    made = Path(tempfile.mkdtemp(prefix="warm-"))
    yield made / "servers"
    for entry in (made / "servers").glob("*.json"):
        with contextlib.suppress(ValueError, KeyError, OSError):
            pid = json.loads(entry.read_text())["pid"]
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def checks(tmp_path: Path) -> Path:
    (tmp_path / "test_forked.py").write_text(CHECKS)
    return tmp_path


def ended_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_running(pid):
            return True
        time.sleep(0.1)
    return False


def runs_a_check(server: ForkServer, checks: Path) -> None:
    server.wait_ready()
    child = server.start(session(checks, "environment"), environment(checks), checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 0, output


def test_a_kept_server_serves_the_next_job_until_it_is_retired(folder, checks):
    started, said = warm_servers(["torch"], 1.0, folder=folder)
    assert said[0].startswith("torch: a warm server started (pid ")
    assert "it ends after 1 minutes with nothing to do" in said[0]
    first = started["torch"]
    assert first.server_pid is not None
    assert process_running(first.server_pid)
    runs_a_check(first, checks)

    # The next job, with or without --keep-warm, forks from the same server.
    for keep in (None, 1.0):
        found, said = warm_servers(["torch"], keep, folder=folder)
        assert found["torch"].server_pid == first.server_pid
        assert found["torch"].path == first.path
        assert said[0].startswith("torch: forked from the warm server started at ")
        runs_a_check(found["torch"], checks)

    # --keep-warm 0: retired; the next job finds none, and starts none without the option.
    found, said = warm_servers(["torch"], 0, folder=folder)
    assert found == {}
    assert said == [f"torch: its warm server (pid {first.server_pid}) was retired"]
    assert ended_within(first.server_pid, 10)
    assert not first.path.exists()
    assert not loaded_files_path(first.path).exists()
    assert warm_servers(["torch"], None, folder=folder) == ({}, [])


def test_a_server_ends_by_itself_once_idle(folder, checks):
    started, _ = warm_servers(["torch"], 3 / 60, folder=folder)  # 3 s
    server = started["torch"]
    assert server.server_pid is not None
    runs_a_check(server, checks)  # busy: a child keeps it
    assert ended_within(server.server_pid, 30)
    assert not server.path.exists()
    found, said = warm_servers(["torch"], None, folder=folder)
    assert found == {}
    assert said == []  # its file said it had ended, and is removed
    assert not list(folder.glob("*.json"))


def test_a_server_whose_imported_file_changed_is_retired_and_replaced(folder, checks, tmp_path):
    started, _ = warm_servers(["torch"], 1.0, folder=folder)
    old = started["torch"]
    old.wait_ready()
    assert old.server_pid is not None
    listed = json.loads(loaded_files_path(old.path).read_text())
    assert str(Path(pytest.__file__).resolve()) in listed  # what it preloaded is listed
    # A module it imported, edited since (one of this test's, written into its list as it was).
    module = tmp_path / "module_it_imported.py"
    module.write_text("VALUE = 1\n")
    stat = module.stat()
    listed[str(module)] = [stat.st_size, stat.st_mtime_ns]
    loaded_files_path(old.path).write_text(json.dumps(listed))
    assert warm_servers(["torch"], None, folder=folder)[0]["torch"].server_pid == old.server_pid
    module.write_text("VALUE = 22\n")

    found, said = warm_servers(["torch"], 1.0, folder=folder)
    new = found["torch"]
    assert new.server_pid != old.server_pid
    assert f"its warm server (pid {old.server_pid}) was retired: {module} changed" in said[0]
    assert ended_within(old.server_pid, 10)
    runs_a_check(new, checks)


def test_a_server_that_ended_is_forgotten(folder):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    folder.mkdir()
    entry = folder / f"torch-{server_key('torch', os.environ)}.json"
    entry.write_text(
        json.dumps(
            {
                "kind": "torch",
                "pid": ended.pid,
                "socket": str(folder / "torch-gone.sock"),
                "idle_exit_s": 60.0,
                "started": time.time(),
                "interpreter": {},
            }
        )
    )
    assert warm_servers(["torch"], None, folder=folder) == ({}, [])
    assert not entry.exists()


def test_a_server_serves_only_jobs_of_its_environment():
    """Its key: the variables that steer the checks and the interpreter's, not the others."""
    base = {"PATH": "/usr/bin", "PYTHONHASHSEED": "0", "VLLM_TARGET_DEVICE": "cpu"}
    key = server_key("vllm", base)
    assert server_key("vllm", {**base, "TERM": "xterm", "OLDPWD": "/"}) == key
    assert server_key("vllm", {**base, "NEMOTRON_VL_FORK_SERVERS": "/tmp/x"}) == key
    assert server_key("vllm", {**base, WARM_SERVERS_ENV: "/tmp/y"}) == key
    for changed in (
        {"VLLM_TARGET_DEVICE": "cuda"},
        {"PYTHONHASHSEED": "1"},
        {"HF_HUB_OFFLINE": "1"},
        {"PYTHONPATH": "/elsewhere"},
    ):
        assert server_key("vllm", {**base, **changed}) != key, changed
    assert server_key("torch", base) != key


def test_a_folder_too_deep_for_a_socket_keeps_no_server_and_says_why(tmp_path):
    deep = tmp_path / ("d" * 120)
    found, said = warm_servers(["torch"], 1.0, folder=deep)
    assert found == {}
    assert said[0].startswith("torch: no warm server kept: its socket's path would be ")
    assert "over the system's 107" in said[0]
    assert not list(deep.glob("*.json"))


def test_the_folder_is_named_by_the_variable_else_this_users_and_checkouts(monkeypatch):
    monkeypatch.setenv(WARM_SERVERS_ENV, "/somewhere/warm")
    assert warm_folder() == Path("/somewhere/warm")
    monkeypatch.delenv(WARM_SERVERS_ENV)
    default = warm_folder()
    assert default.name.startswith(f"nemotron-vl-warm-{os.getuid()}-")
    assert len(str(default / "vllm-0123456789abcdef-01234567.sock.files.json")) < 108


@pytest.mark.parametrize("minutes", ["-1", "nan"])
def test_a_bad_keep_warm_is_refused_naming_it(tmp_path, minutes):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.conformance",
            "--out",
            str(tmp_path),
            "--keep-warm",
            minutes,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert f"--keep-warm: expected minutes, at least 0, got {minutes}" in proc.stderr
