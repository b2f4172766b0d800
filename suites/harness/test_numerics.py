"""Results kept across checks are compared under the numerics they were computed with.

On a CPU whose kernels split reductions by thread count (measured with AMX: vLLM's tower rows
at 1 and 2 threads differ in some elements by a bf16 rounding step), a request run kept by one
check and run again by a later check at another thread count differs bit for bit. The main job
changes a process's count between checks (:mod:`harness.plugin.cores`), so such a check failed
at random. Here a target's rows are made to depend on the count on every machine, by the
smallest step that shows (``2**-10``), and the real conformance check runs at another count
than the kept run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.requests import Request, RequestResult
from harness.numerics import Numerics, current_numerics
from harness.plugin.target import RequestRuns
from harness.targets.reference import ReferenceTarget
from suites.conformance import test_requests as requests_suite

FORM = "images-pil"


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def thread_dependent_runs(monkeypatch: pytest.MonkeyPatch) -> tuple[RequestRuns, list[int]]:
    """The reference's runs of :data:`FORM`, each item's rows moved by ``threads * 2**-10``;
    and the thread count of each run the model made."""
    runs = RequestRuns(ReferenceTarget(), torch.device("cpu"))
    model = runs.model(FORM)
    real = model.run_request
    counts: list[int] = []

    def run_request(request: Request, *, cached: bool = False) -> RequestResult:
        result = real(request, cached=cached)
        counts.append(torch.get_num_threads())
        step = torch.get_num_threads() * 2.0**-10
        return dataclasses.replace(result, embeddings=[e + step for e in result.embeddings])

    monkeypatch.setattr(model, "run_request", run_request)
    return runs, counts


def test_the_numerics_are_torchs_thread_count(threads: None) -> None:
    torch.set_num_threads(1)
    assert current_numerics() == Numerics(threads=1)
    torch.set_num_threads(2)
    assert current_numerics() == Numerics(threads=2)


def test_a_check_at_another_thread_count_than_the_kept_run_passes(
    monkeypatch: pytest.MonkeyPatch, threads: None
) -> None:
    runs, counts = thread_dependent_runs(monkeypatch)
    torch.set_num_threads(1)
    kept = runs.run(FORM)  # an earlier check, before the main job handed this process a core
    torch.set_num_threads(2)
    requests_suite.test_request_is_processed_and_embedded(runs, FORM)
    # The check's kept run is its own count's; the earlier one is still kept for checks at 1.
    assert counts == [1, 2, 2, 2]
    torch.set_num_threads(1)
    assert runs.run(FORM) is kept
    assert counts == [1, 2, 2, 2]


def test_at_one_thread_count_a_run_is_kept(monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    runs, counts = thread_dependent_runs(monkeypatch)
    torch.set_num_threads(2)
    first = runs.run(FORM)
    assert runs.run(FORM) is first
    assert counts == [2]
    assert FORMS_BY_NAME[FORM].request.num_items("image") == len(first.items)
