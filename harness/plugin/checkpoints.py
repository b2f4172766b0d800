"""One set of checkpoint folders for a test run and every process it starts.

The harness's own tests start dozens of processes (the main job, the gate, forked mutant runs),
each of which would write the same folders again; the session opens
:func:`harness.checkpoints.cache.shared_folders` and each process reads the folders the first
one wrote.
"""

from __future__ import annotations

import contextlib

import pytest

from harness.checkpoints.cache import shared_folders

_FOLDERS = pytest.StashKey[contextlib.ExitStack]()


def pytest_configure(config: pytest.Config) -> None:
    stack = contextlib.ExitStack()
    stack.enter_context(shared_folders())
    config.stash[_FOLDERS] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_FOLDERS, None)
    if stack is not None:
        stack.close()
