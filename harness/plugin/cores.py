"""``--core-share-file PATH``: torch's thread count follows the main job's share of the cores.

The main job writes the number of cores each of its running processes may use to one file
(:class:`harness.jobs.cores.CoreShare`); before each check, this process reads it and, when it
changed, sets torch's intra-op thread count to it. Without the option, nothing changes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.jobs.cores import read_share


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nemotron-vl").addoption(
        "--core-share-file",
        default=None,
        metavar="PATH",
        help="the main job's file holding this process's share of the cores (torch's threads)",
    )


class ThreadsFollowShare:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied: int | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        share = read_share(self.path)
        torch = sys.modules.get("torch")  # a check that has not imported torch needs no threads
        if share is None or share == self.applied or torch is None:
            return
        torch.set_num_threads(share)
        self.applied = share


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--core-share-file")
    if path:
        config.pluginmanager.register(ThreadsFollowShare(Path(path)), "nemotron-vl-cores")
