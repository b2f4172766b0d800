"""A pytest plugin that makes one check's outcome depend on torch's thread count: the flake
hunt's tests load it into the main jobs they run (``-p suites.harness.thread_dependent_plugin``)
and expect the hunt to find that check, and only it."""

from __future__ import annotations

from collections.abc import Generator

import pytest

#: The check that fails at more than one thread.
THREAD_DEPENDENT = "test_request_is_processed_and_embedded[images-pil]"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    import torch

    if item.name == THREAD_DEPENDENT and torch.get_num_threads() > 1:
        raise AssertionError(f"ran at {torch.get_num_threads()} threads")
    return (yield)
