"""Root conftest: loads the harness's pytest plugin for every run from this tree."""

from __future__ import annotations

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
    """In a pytest-xdist worker (``nox -s tests`` spreads whole modules over the cores), the
    modules with slow tests first: the longest start at once instead of last, alone on one core
    while the others idle. Each worker sorts the same collection the same way, as xdist needs."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
