"""Warm fork servers (``--keep-warm``, :mod:`harness.jobs.warm`): kept between main jobs, used by
the next job while they are what it would start, retired once a file they imported changes, gone
once idle and no job holds them.

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
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT
from harness.jobs.forkserver import (
    SHARED_SERVERS_ENV,
    ForkServer,
    lease_path,
    loaded_files_changed,
    loaded_files_path,
)
from harness.jobs.preload import process_running
from harness.jobs.warm import (
    WARM_SERVERS_ENV,
    job_fork_servers,
    retire_all,
    server_key,
    warm_folder,
    warm_servers,
)
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


WARM_CHECKS = (
    CHECKS
    + """
def test_signals_as_in_a_new_process():
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # not its server's
"""
)


@pytest.fixture
def checks(tmp_path: Path) -> Path:
    (tmp_path / "test_forked.py").write_text(WARM_CHECKS)
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
    child = server.start(session(checks, "environment or signals"), environment(checks), checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 0, output
    assert "2 passed" in output


def its_files(server: ForkServer) -> list[Path]:
    return [
        path
        for path in (server.path, loaded_files_path(server.path), lease_path(server.path))
        if path.exists()
    ]


@pytest.mark.slow  # servers preload and end: 3 to 10 s
def test_a_kept_server_serves_the_next_jobs_until_it_is_retired(folder, checks):
    with warm_servers(["torch"], 1.0, folder=folder) as (started, said):
        assert said[0].startswith("torch: a warm server started (pid ")
        assert said[0].endswith("it ends after 1 minute with nothing to do")
        first = started["torch"]
        assert first.server_pid is not None
        assert process_running(first.server_pid)
        runs_a_check(first, checks)

    # The next jobs, with or without --keep-warm, fork from the same server.
    for keep in (None, 1.0):
        with warm_servers(["torch"], keep, folder=folder) as (found, said):
            assert found["torch"].server_pid == first.server_pid
            assert found["torch"].path == first.path
            assert said[0].startswith("torch: forked from the warm server started at ")
            runs_a_check(found["torch"], checks)

    # --keep-warm 0 retires every one; a later job without the option starts its own.
    assert retire_all(folder=folder) == [
        f"torch: its warm server (pid {first.server_pid}) was retired"
    ]
    assert ended_within(first.server_pid, 15)
    assert its_files(first) == []
    with warm_servers(["torch"], None, folder=folder) as (found, said):
        assert found == {}
        assert said == ["torch: a server for this run alone (no warm server)"]


@pytest.mark.slow  # servers preload and end: 3 to 10 s
@pytest.mark.exhaustive
def test_a_server_outlives_its_idle_time_while_a_job_holds_it_then_ends(folder, checks):
    with warm_servers(["torch"], 2 / 60, folder=folder) as (started, _):  # 2 s
        server = started["torch"]
        assert server.server_pid is not None
        runs_a_check(server, checks)
        time.sleep(4)
        assert process_running(server.server_pid)  # the job may fork again
        runs_a_check(server, checks)
    assert ended_within(server.server_pid, 30)
    assert its_files(server) == []
    with warm_servers(["torch"], None, folder=folder) as (found, said):
        assert found == {}
        assert said == [
            f"torch: a server for this run alone (its warm server (pid {server.server_pid}) "
            "has ended)"
        ]
    assert not list(folder.glob("*.json"))  # its file, forgotten


@pytest.mark.slow  # servers preload and end: 3 to 10 s
@pytest.mark.exhaustive
def test_a_server_retired_while_it_preloads_serves_its_job_then_ends(folder, checks):
    with warm_servers(["torch"], 1.0, folder=folder) as (started, _):
        server = started["torch"]
        assert server.server_pid is not None
        assert not server.path.exists()  # still preloading
        assert retire_all(folder=folder) == [
            f"torch: its warm server (pid {server.server_pid}) was retired"
        ]
        runs_a_check(server, checks)  # the signal did not end it
    assert ended_within(server.server_pid, 30)


@pytest.mark.slow  # servers preload and end: 3 to 10 s
@pytest.mark.exhaustive
def test_a_server_whose_imported_file_changed_is_retired_and_replaced(folder, checks, tmp_path):
    with warm_servers(["torch"], 1.0, folder=folder) as (started, _):
        old = started["torch"]
        old.wait_ready()
    assert old.server_pid is not None
    listed = json.loads(loaded_files_path(old.path).read_text())
    assert os.path.abspath(pytest.__file__) in listed  # what it preloaded is listed
    # A module it imported, edited since (one of this test's, written into its list as it was).
    module = tmp_path / "module_it_imported.py"
    module.write_text("VALUE = 1\n")
    stat = module.stat()
    listed[str(module)] = [stat.st_size, stat.st_mtime_ns]
    loaded_files_path(old.path).write_text(json.dumps(listed))
    with warm_servers(["torch"], None, folder=folder) as (found, _):
        assert found["torch"].server_pid == old.server_pid
    module.write_text("VALUE = 22\n")

    with warm_servers(["torch"], 1.0, folder=folder) as (found, said):
        new = found["torch"]
        assert new.server_pid != old.server_pid
        assert f"its warm server (pid {old.server_pid}) was retired: {module} changed" in said[0]
        assert ended_within(old.server_pid, 15)
        runs_a_check(new, checks)


def test_jobs_that_start_together_start_one_server(folder):
    """The folder's lock: the second job to look finds the server the first one started."""
    barrier = threading.Barrier(2, timeout=60)  # a job that fails breaks it for the other
    pids: list[int | None] = []

    def job() -> None:
        barrier.wait()
        with warm_servers(["torch"], 1.0, folder=folder) as (found, _):
            pids.append(found["torch"].server_pid)
            barrier.wait()  # both hold it at once

    jobs = [threading.Thread(target=job) for _ in range(2)]
    for thread in jobs:
        thread.start()
    for thread in jobs:
        thread.join(timeout=60)
    assert len(pids) == 2
    assert pids[0] == pids[1]
    assert len(list(folder.glob("torch-*.json"))) == 1
    retire_all(folder=folder)


def test_a_test_runs_shared_servers_come_before_warm_ones(tmp_path, monkeypatch, capsys):
    """Within a run of the harness's tests, its main jobs fork from its servers and keep none."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "root").write_text(str(ROOT))
    (shared / "interpreter.json").write_text("{}")
    (shared / "vllm.pid").write_text(str(os.getpid()))
    monkeypatch.setenv(SHARED_SERVERS_ENV, str(shared))
    monkeypatch.setenv(WARM_SERVERS_ENV, str(tmp_path / "warm"))
    with job_fork_servers(["vllm"], 1.0) as servers:
        assert servers["vllm"].path == shared / "vllm.sock"
    assert "=== fork servers: the test run's; none kept warm ===" in capsys.readouterr().out
    assert not (tmp_path / "warm").exists()


def test_a_list_of_files_that_cannot_be_read_is_a_change(tmp_path):
    socket = tmp_path / "torch-key-0000.sock"
    assert loaded_files_changed(socket) is None  # no socket yet: still preloading
    socket.touch()
    assert "cannot be read" in (loaded_files_changed(socket) or "")
    loaded_files_path(socket).write_text('{"/x.py": "not a pair"}')
    assert "cannot be read" in (loaded_files_changed(socket) or "")


def entry(folder: Path, pid: int, socket: Path) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"torch-{server_key('torch', os.environ)}.json"
    path.write_text(
        json.dumps(
            {
                "kind": "torch",
                "pid": pid,
                "socket": str(socket),
                "idle_exit_s": 60.0,
                "started": time.time(),
                "interpreter": {},
            }
        )
    )
    return path


def test_a_server_that_ended_is_forgotten_and_a_pid_used_again_is_not_signalled(folder):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    path = entry(folder, ended.pid, folder / "torch-gone.sock")
    with warm_servers(["torch"], None, folder=folder) as (found, said):
        assert found == {}
        assert said == [
            f"torch: a server for this run alone (its warm server (pid {ended.pid}) has ended)"
        ]
    assert not path.exists()
    # A process that runs under the pid an ended server had: not that server.
    path = entry(folder, os.getpid(), folder / "torch-gone.sock")
    assert retire_all(folder=folder) == []  # and no SIGUSR1 to this process
    assert not path.exists()


def test_an_entry_naming_a_socket_elsewhere_is_not_used(folder, tmp_path):
    path = entry(folder, os.getpid(), tmp_path / "elsewhere.sock")
    with warm_servers(["torch"], None, folder=folder) as (found, said):
        assert found == {}
        assert "names a socket outside its folder" in said[0]
    assert not path.exists()


def test_a_folder_others_may_enter_keeps_no_server_and_says_why(folder):
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with warm_servers(["torch"], 1.0, folder=folder) as (found, said):
        assert found == {}
        assert said == [
            f"no warm server: {folder}: expected mode drwx------ (others may not enter it), "
            "got drwxr-xr-x"
        ]
    assert list(folder.iterdir()) == []


def test_a_folder_too_deep_for_a_socket_keeps_no_server_and_says_why(tmp_path):
    deep = tmp_path / ("d" * 120)
    with warm_servers(["torch"], 1.0, folder=deep) as (found, said):
        assert found == {}
        assert said[0].startswith("torch: no warm server kept: its socket's path would be ")
        assert "over the system's 107" in said[0]
    assert not list(deep.glob("*.json"))


def test_a_server_serves_only_jobs_of_its_environment():
    """Its key: the variables that steer the checks, the interpreter's and those read as a
    process starts, not the others."""
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
        {"LD_PRELOAD": "/lib/x.so"},
        {"TZ": "Asia/Tokyo"},
        {"KMP_AFFINITY": "compact"},
    ):
        assert server_key("vllm", {**base, **changed}) != key, changed
    assert server_key("torch", base) != key


def test_the_folder_is_named_by_the_variable_else_this_users_and_checkouts(monkeypatch):
    monkeypatch.setenv(WARM_SERVERS_ENV, "/somewhere/warm")
    assert warm_folder() == Path("/somewhere/warm")
    monkeypatch.setenv(WARM_SERVERS_ENV, "relative/warm")
    assert warm_folder() == Path.cwd() / "relative" / "warm"  # the servers run elsewhere
    monkeypatch.delenv(WARM_SERVERS_ENV)
    default = warm_folder()
    assert default.name.startswith(f"nemotron-vl-warm-{os.getuid()}-")
    bound_first = default / ".vllm-0123456789abcdef-01234567.sock.4194304"
    assert len(os.fsencode(bound_first)) <= 107


@pytest.mark.parametrize("minutes", ["-1", "nan", "inf"])
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
    assert f"--keep-warm: expected minutes, at least 0 and finite, got {minutes}" in proc.stderr
