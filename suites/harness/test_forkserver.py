"""The fork server: target processes forked from one that imported torch (and vLLM) once.

Each test starts a real server of the ``torch`` kind (it preloads in about 2 s) and runs small
pytest sessions in its children, checking what the supervisor relies on: the session runs in the
folder and environment it is given, its output arrives through the pipe, its exit status is
pytest's (or the signal that ended it), its process group can be killed through the server, and
a client that goes away takes its child with it. The main job's own outcomes with and without
the server are compared in ``test_report.py``.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ROOT
from harness.jobs.forkserver import (
    SHARED_SERVERS_ENV,
    ForkedProcess,
    ForkServer,
    ForkServerError,
    failed_path,
    kind_of,
    shared_servers,
    start_server,
    stop_servers,
)
from harness.jobs.preload import process_running
from harness.jobs.processes import group_memory_bytes, kill_group

CHECKS = """
import os, signal, time

def test_environment_and_folder():
    assert os.environ["FORKED_CHECK"] == "yes"
    assert os.getcwd() == os.environ["EXPECTED_CWD"]
    print("hello from the child")

def test_fails():
    assert 1 == 2

def test_segfaults():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_sleeps():
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    started = start_server("torch", tmp_path_factory.mktemp("servers"))
    try:
        started.wait_ready()
        yield started
    finally:
        stop_servers([started])


@pytest.fixture
def checks(tmp_path: Path) -> Path:
    (tmp_path / "test_forked.py").write_text(CHECKS)
    return tmp_path


def session(folder: Path, selection: str) -> list[str]:
    return [
        str(folder / "test_forked.py"),
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        selection,
    ]


def output_of(child: ForkedProcess, timeout: float = 60.0) -> str:
    """What the child said, read until it ends or ``timeout`` passes (a hung child fails the
    test instead of hanging it)."""
    assert child.stdout is not None
    said = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([child.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(child.stdout.fileno(), 1 << 16)
            if not chunk:
                child.stdout.close()
                return said.decode(errors="replace")
            said += chunk
    pytest.fail(f"the child did not end in {timeout} s; it said:\n{said.decode()[-3000:]}")


def environment(folder: Path) -> dict[str, str]:
    return {**os.environ, "FORKED_CHECK": "yes", "EXPECTED_CWD": str(folder)}


def test_a_child_runs_its_session_in_its_folder_and_environment(server, checks):
    child = server.start(session(checks, "environment"), environment(checks), checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 0, output
    assert "1 passed" in output
    assert child.pid != os.getpid()


def test_a_failing_session_exits_with_pytests_status(server, checks):
    child = server.start(session(checks, "fails"), environment(checks), checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 1, output  # pytest: tests failed
    assert "1 failed" in output


def test_a_child_killed_by_a_signal_says_which(server, checks):
    child = server.start(session(checks, "segfaults"), environment(checks), checks, quiet=True)
    assert child.stdout is None
    assert child.wait(timeout=60) == -signal.SIGSEGV


def test_a_childs_process_group_is_its_own_and_is_killed_through_the_server(server, checks):
    child = server.start(session(checks, "sleeps"), environment(checks), checks)
    time.sleep(2.0)
    assert child.poll() is None
    assert os.getpgid(child.pid) == child.pid  # its own session: the supervisor kills the group
    assert group_memory_bytes(child.pid) > 0
    kill_group(child)
    assert child.returncode == -signal.SIGKILL


def test_a_client_that_goes_away_takes_its_child_with_it(server, checks):
    child = server.start(session(checks, "sleeps"), environment(checks), checks)
    time.sleep(1.0)
    pid = child.pid
    child._conn.close()  # as when the supervisor's process dies
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process_running(pid):
        time.sleep(0.1)
    assert not process_running(pid)


def test_a_server_whose_preload_failed_says_why(tmp_path):
    path = tmp_path / "vllm.sock"
    failed_path(path).write_text("Traceback ...\nImportError: no module named vllm\n")
    with pytest.raises(ForkServerError, match=r"its preload failed.*no module named vllm"):
        ForkServer("vllm", path).wait_ready()


def test_a_server_that_ended_before_it_was_ready_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    server = start_server("torch", tmp_path)
    with pytest.raises(ForkServerError, match=r"fork server torch: it ended \(1\)"):
        server.wait_ready()


def test_an_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="expected one of \\('torch', 'vllm'\\), got 'jax'"):
        start_server("jax", tmp_path)


def test_vllms_targets_come_from_the_server_that_preloads_vllm():
    assert kind_of("vllm") == "vllm"
    assert kind_of("vllm-file:/tmp/nano_nemotron_vl.py") == "vllm"
    assert kind_of("reference") == "torch"
    assert kind_of("reference-mutant:deepcopy-live-config") == "torch"


def test_a_main_job_uses_the_test_runs_servers_only_if_they_are_this_checkouts(
    tmp_path, monkeypatch
):
    """A server preloads its checkout's harness: a main job of another checkout (the gate's
    base side runs from an export, a clone's tests) starts its own."""
    monkeypatch.setenv(SHARED_SERVERS_ENV, str(tmp_path))
    (tmp_path / "root").write_text(str(ROOT))
    (tmp_path / "interpreter.json").write_text('{"PYTHONHASHSEED": "0"}')
    (tmp_path / "vllm.pid").write_text(str(os.getpid()))
    servers = shared_servers(["vllm"])
    assert servers is not None
    assert servers["vllm"].path == tmp_path / "vllm.sock"
    assert servers["vllm"].process is None  # not this process's to stop
    assert servers["vllm"].interpreter == {"PYTHONHASHSEED": "0"}
    assert servers["vllm"].server_pid == os.getpid()
    (tmp_path / "root").write_text("/elsewhere/checkout")
    assert shared_servers(["vllm"]) is None
    monkeypatch.delenv(SHARED_SERVERS_ENV)
    assert shared_servers(["vllm"]) is None


def test_a_child_finds_modules_on_its_own_pythonpath(server, checks, tmp_path_factory):
    """As a new ``python -m pytest`` would: its folder first, then its PYTHONPATH's entries."""
    extra = tmp_path_factory.mktemp("extra")
    (extra / "module_of_the_test.py").write_text("VALUE = 42\n")
    (checks / "test_forked.py").write_text(
        "import sys\n"
        "def test_path():\n"
        "    import module_of_the_test\n"
        "    assert module_of_the_test.VALUE == 42\n"
        f"    assert sys.path[:2] == [{str(checks)!r}, {str(extra)!r}]\n"
    )
    env = {**environment(checks), "PYTHONPATH": str(extra)}
    child = server.start(session(checks, "path"), env, checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 0, output


def test_a_process_whose_interpreter_variables_differ_is_refused(server, checks):
    """PYTHONHASHSEED (and every PYTHON* variable but PYTHONPATH) takes effect when an
    interpreter starts: such a process must start as a new Python, and the supervisor does."""
    env = {**environment(checks), "PYTHONHASHSEED": "12345"}
    with pytest.raises(ForkServerError, match="the process's PYTHONHASHSEED differ"):
        server.start(session(checks, "environment"), env, checks)


def test_a_shared_server_that_ended_before_it_was_ready_is_named(tmp_path):
    """A main job waiting for a test run's server that died while it preloaded hears so at
    once, not after the preload's limit."""
    ended = ForkServer("vllm", tmp_path / "vllm.sock", server_pid=2**22 + 1)  # no such process
    with pytest.raises(ForkServerError, match="fork server vllm: it ended before it was ready"):
        ended.wait_ready()


COMMAND = """
import os, sys

print("argv", sys.argv[1:], "as", __name__, "in", os.getcwd(), os.environ["FORKED_CHECK"])
if sys.argv[1] == "raises":
    raise RuntimeError("uncaught")
raise SystemExit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(("argument", "status"), [("0", 0), ("7", 7), ("raises", 1)])
def test_a_child_runs_another_module_as_python_m_would(server, checks, argument, status):
    """``python -m forked_command ARG`` in the child's folder (first on its ``sys.path``): run as
    ``__main__`` with its arguments, in its environment; its exit status as a new Python's."""
    (checks / "forked_command.py").write_text(COMMAND)
    child = server.start([argument], environment(checks), checks, module="forked_command")
    output = output_of(child)
    assert child.wait(timeout=60) == status, output
    assert f"argv ['{argument}'] as __main__ in {checks} yes" in output
    if argument == "raises":
        assert "RuntimeError: uncaught" in output


def answer_to(server: ForkServer, message: bytes, *, with_pipe: bool) -> str:
    """The server's answer to one message sent on a connection of its own (a request's output
    pipe attached ``with_pipe``)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(server.path))
        conn.settimeout(10)
        if with_pipe:
            read, write = os.pipe()
            socket.send_fds(conn, [message], [write])
            os.close(write)
            os.close(read)
        else:
            conn.send(message)
        return conn.recv(1 << 16).decode()
    finally:
        conn.close()


def test_a_bad_message_is_answered_and_the_server_goes_on(server, checks):
    answer = answer_to(server, b"kill nine", with_pipe=False)
    assert answer.startswith("error: kill: expected a signal number"), answer
    request = b'{"args": "not a list", "env": {}, "cwd": "/"}'
    assert "args: a list of strings" in answer_to(server, request, with_pipe=True)
    request = b'{"args": [], "env": {}, "cwd": "/", "module": 5}'
    assert "module (optional): a module's name" in answer_to(server, request, with_pipe=True)
    child = server.start(session(checks, "environment"), environment(checks), checks)
    output = output_of(child)
    assert child.wait(timeout=60) == 0, output


def test_a_child_whose_server_ends_is_killed_and_says_so(tmp_path, checks):
    started = start_server("torch", tmp_path)
    try:
        started.wait_ready()
        child = started.start(session(checks, "sleeps"), environment(checks), checks)
        time.sleep(1.0)
        assert started.process is not None
        started.process.kill()  # the server dies (the OOM killer, a signal)
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert child.server_lost
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process_running(child.pid):
            time.sleep(0.1)
        assert not process_running(child.pid)
    finally:
        stop_servers([started])
