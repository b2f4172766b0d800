"""The main job's cores handed on as its processes end (:mod:`harness.jobs.cores`): the share
each running process may use, and a process's torch threads following it between checks
(:mod:`harness.plugin.cores`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack

import pytest

from harness.jobs.cores import THREAD_VARIABLES, CoreShare, cores_shared, read_share
from suites.harness.helpers import ROOT, one_thread_env


def test_the_share_is_the_cores_over_the_processes_running(tmp_path):
    path = tmp_path / "share"
    cores = CoreShare(4, path)
    seen = [read_share(path)]  # none running yet: all 4
    with ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(cores.held())
            seen.append(read_share(path))
        with cores.held():
            seen.append(read_share(path))  # 4 running
        seen.append(read_share(path))  # 3 again
    seen.append(read_share(path))  # all ended
    # By hand: 4 // 1, 4 // 2, 4 // 3, 4 // 4, 4 // 3, and never below 1.
    assert seen == [4, 4, 2, 1, 1, 1, 4]
    two = CoreShare(2, tmp_path / "two")
    with two.held(), two.held(), two.held():
        assert read_share(two.path) == 1  # 3 processes on 2 cores: one thread each, not 0


def test_a_process_that_fails_still_hands_its_cores_on(tmp_path):
    cores = CoreShare(2, tmp_path / "share")
    with cores.held():
        with pytest.raises(RuntimeError), cores.held():
            raise RuntimeError("the supervisor failed")
        assert read_share(cores.path) == 2


@pytest.mark.parametrize("text", ["", "two", "0", "-1", "1.5"])
def test_a_share_file_without_a_positive_count_is_ignored(tmp_path, text):
    (tmp_path / "share").write_text(text)
    assert read_share(tmp_path / "share") is None
    assert read_share(tmp_path / "missing") is None


def test_no_cores_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"CoreShare.cores: expected at least 1, got 0"):
        CoreShare(0, tmp_path / "share")


@pytest.fixture
def no_thread_variables(monkeypatch):
    for variable in THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_processes_side_by_side_start_with_their_share_and_hand_it_on(no_thread_variables):
    with cores_shared(3, cores=8) as cores:
        # By hand: 8 cores over 3 processes, 2 threads each (the remainder is handed on later).
        assert [os.environ[v] for v in THREAD_VARIABLES] == ["2", "2"]
        assert cores is not None
        assert read_share(cores.path) == 8
        with cores.held(), cores.held(), cores.held():
            assert read_share(cores.path) == 2
        folder = cores.path.parent
    assert not folder.exists()  # the share file goes with the run


def test_one_process_keeps_the_threads_it_has(no_thread_variables):
    with cores_shared(1, cores=8) as cores:
        assert cores is None
        assert not any(v in os.environ for v in THREAD_VARIABLES)


def test_a_thread_count_the_caller_set_stands(no_thread_variables, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with cores_shared(2, cores=8) as cores:
        assert cores is None  # no share changes the caller's count as processes end
        assert os.environ["OMP_NUM_THREADS"] == "3"


def _pytest_with_cores_plugin(tmp_path, *options: str) -> subprocess.CompletedProcess[str]:
    """``pytest test_threads.py`` in ``tmp_path`` with the cores plugin and ``options``, in file
    order (outside the repository no pyproject turns pytest-randomly off)."""
    env = one_thread_env()
    env["PYTHONPATH"] = str(ROOT)
    plugins = ["-p", "harness.plugin.cores", "-p", "no:cacheprovider", "-p", "no:randomly"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *options, "-q", "test_threads.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_a_process_threads_follow_the_share_between_checks(tmp_path):
    share = tmp_path / "share"
    share.write_text("1\n")
    (tmp_path / "test_threads.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path

            import torch

            SHARE = Path({str(share)!r})


            def test_first():
                assert torch.get_num_threads() == 1
                SHARE.write_text("2\\n")  # a sibling process ended


            def test_second():
                assert torch.get_num_threads() == 2
                SHARE.write_text("nonsense\\n")


            def test_third():
                assert torch.get_num_threads() == 2  # kept: no count in the file
            """
        )
    )
    proc = _pytest_with_cores_plugin(tmp_path, f"--core-share-file={share}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout


def test_a_schedule_sets_each_checks_thread_count_in_turn(tmp_path):
    (tmp_path / "test_threads.py").write_text(
        textwrap.dedent(
            """
            import pytest
            import torch


            # By hand: the k-th check runs at the (k mod 3)-th count of 3,1,2.
            @pytest.mark.parametrize("expected", [3, 1, 2, 3, 1])
            def test_count(expected):
                assert torch.get_num_threads() == expected
            """
        )
    )
    proc = _pytest_with_cores_plugin(tmp_path, "--thread-schedule=3,1,2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "5 passed" in proc.stdout


@pytest.mark.parametrize("schedule", ["", "2,", "0", "two", "1.5", "²"])
def test_a_schedule_of_anything_but_positive_counts_is_refused(schedule):
    from harness.plugin.cores import parse_schedule

    with pytest.raises(pytest.UsageError, match=r"--thread-schedule: expected positive thread"):
        parse_schedule(schedule)
    assert parse_schedule(" 2, 1") == (2, 1)


def test_a_schedule_and_a_share_file_together_are_refused(tmp_path):
    (tmp_path / "test_threads.py").write_text("def test_nothing():\n    pass\n")
    proc = _pytest_with_cores_plugin(
        tmp_path, "--thread-schedule=2,1", f"--core-share-file={tmp_path / 'share'}"
    )
    assert proc.returncode != 0
    assert "--thread-schedule and --core-share-file both set torch's threads" in proc.stderr
