"""Root conftest: loads the harness's pytest plugin for every run from this tree."""

from __future__ import annotations

import json
import os

import pytest

from harness import environment

# No model hub at run time: configs and tokenizers are built in code. (VLLM_TARGET_DEVICE is set
# by the vllm target itself, before its first import of vLLM.)
environment.apply(environment.OFFLINE)
# A main job started by a test runs its targets: no test reads outcomes another run kept
# (harness.jobs.kept); the tests of that reuse name a folder of their own.
environment.apply({"NEMOTRON_VL_KEPT_OUTCOMES": "off"})

pytest_plugins = ("harness.plugin",)


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
