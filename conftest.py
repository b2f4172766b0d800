"""Root conftest: loads the harness's pytest plugin for every run from this tree."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from harness import ROOT, environment
from harness.checkpoints.cache import DEFAULT_SHARED_FOLDERS, SHARED_FOLDERS_ENV, kept_folders

# No model hub at run time: configs and tokenizers are built in code. (VLLM_TARGET_DEVICE is set
# by the vllm target itself, before its first import of vLLM.)
environment.apply(environment.OFFLINE)
# A main job started by a test runs its targets: no test reads outcomes another run kept
# (harness.jobs.kept); the tests of that reuse name a folder of their own.
environment.apply({"NEMOTRON_VL_KEPT_OUTCOMES": "off"})
# Every process of a test run (and of the main jobs its tests start) reads each checkpoint folder
# from one kept folder, written once (harness.checkpoints.cache); a process started with the
# variable set (a main job's target, NEMOTRON_VL_CHECKPOINTS=off) keeps what it was given.
if SHARED_FOLDERS_ENV not in os.environ:
    os.environ[SHARED_FOLDERS_ENV] = str(kept_folders(DEFAULT_SHARED_FOLDERS))

pytest_plugins = ("harness.plugin",)

#: The tests that start main jobs, gates and kill matrices in processes of their own.
HARNESS_TESTS = ROOT / "suites" / "harness"


def _runs_harness_tests(config: pytest.Config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HARNESS_TESTS or HARNESS_TESTS in path.parents or path in HARNESS_TESTS.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    """A run of the harness's own tests shares one fork server of each kind with every main job
    its tests start (harness.jobs.forkserver): each of their target processes is a fork, not a
    new Python importing torch and vLLM again. Not in a process a main job or a test started
    (it inherits the run's), nor in a pytest-xdist worker (its controller's run has them)."""
    from harness.jobs.forkserver import SHARED_SERVERS_ENV, shared_with_started_processes

    if SHARED_SERVERS_ENV in os.environ or not _runs_harness_tests(config):
        return
    stack = contextlib.ExitStack()
    stack.enter_context(shared_with_started_processes())
    config.add_cleanup(stack.close)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (``nox -s tests -- -n 2 --dist loadfile`` spreads whole modules
    over the cores), the modules with slow tests first: the longest start at once instead of
    last, alone on one core while the others idle. Each worker sorts the same collection the
    same way, as xdist needs."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


def _plain(value: object) -> bool:
    """Whether pytest-xdist can send ``value`` to its controller (plain values only)."""
    if type(value) in (str, int, float, bool, type(None)):
        return True
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, dict) and type(value) is dict:
        return all(type(key) is str and _plain(item) for key, item in value.items())
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In a pytest-xdist worker a check's report travels to the controller, which sends plain
    values only: a property recorded as an object (a serving configuration, numpy numbers) goes
    as JSON's form of it, its text where JSON has none (what JUnit XML writes of it anyway)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    report.user_properties = [
        (name, value if _plain(value) else json.loads(json.dumps(value, default=str)))
        for name, value in report.user_properties
    ]
