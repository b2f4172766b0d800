"""A thread stress loop shared by the concurrency suites: many threads started together call the
same functions and every result is compared with the single-threaded one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

THREADS = 32


@dataclass
class ThreadedRun:
    """What :func:`run_in_threads` saw: calls that returned, errors raised, wrong results."""

    calls: int
    errors: list[str]  # "TypeName: message" of every call that raised
    wrong: int  # results that differ from the single-threaded ones

    def problems(self) -> list[str]:
        found = []
        if self.errors:
            found.append(f"{len(self.errors)} calls raised, e.g. {self.errors[:3]}")
        if self.wrong:
            found.append(f"{self.wrong} results differ from the single-threaded ones")
        return found

    def check(self) -> None:
        problems = self.problems()
        assert problems == [], "; ".join(problems)


def run_in_threads(
    work: Sequence[Callable[[], object]], calls_per_thread: int, threads: int = THREADS
) -> ThreadedRun:
    """Call ``work`` round-robin, ``calls_per_thread`` times in each of ``threads`` threads
    released together by a barrier, and compare every result with the single-threaded one."""
    expected = [call() for call in work]
    errors: list[str] = []
    wrong = 0
    calls = 0
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker(offset: int) -> None:
        nonlocal wrong, calls
        start.wait()
        for i in range(calls_per_thread):
            k = (offset + i) % len(work)
            try:
                result = work[k]()
            except BaseException as e:  # collected: a Rust panic in a tokenizer is no Exception
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            with lock:
                calls += 1
                if result != expected[k]:
                    wrong += 1

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return ThreadedRun(calls, errors, wrong)
