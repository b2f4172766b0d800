"""The main job's cores, handed on as its processes end.

The main job starts its processes (one per target, or per group of a target's checks) side by
side, each with its share of the cores for torch's threads (``OMP_NUM_THREADS``). The targets
do not take equally long (on 2 cores, vLLM's checks in bf16 take about three times the
reference's), so when one process ends, its cores would sit idle while the others go on with
one thread each. :class:`CoreShare` keeps the count of processes running and writes
``cores // running`` to one file when it changes; each process reads it before each check
(:mod:`harness.plugin.cores`) and sets torch's thread count to it. A check's outcome does not
depend on the thread count, only its time does: on some CPUs another count rounds a product
otherwise, so a comparison within a bound allows for it (the same unit roundoff), and a result
kept for a bit-exact comparison by a later check is kept per count (:mod:`harness.numerics`);
the flake hunt (:mod:`harness.jobs.flakes`) runs the suites at fixed, shared and changing counts
to hold this.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The variables that set a process's thread count (torch's OpenMP threads, MKL's).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class CoreShare:
    """``cores`` shared among the processes running side by side: the share,
    ``max(1, cores // running)``, written to ``path`` each time one starts or ends."""

    def __init__(self, cores: int, path: Path) -> None:
        if cores < 1:
            raise ValueError(f"CoreShare.cores: expected at least 1, got {cores!r}")
        self.cores = cores
        self.running = 0
        self.path = path
        self._lock = threading.Lock()
        self._write()

    @property
    def share(self) -> int:
        return max(1, self.cores // max(1, self.running))

    @contextmanager
    def held(self) -> Iterator[None]:
        """One process (with its restarts) runs inside: its cores go to the others after."""
        with self._lock:
            self.running += 1
            self._write()
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
                self._write()

    def _write(self) -> None:
        # Written whole, then renamed: a reader never sees a half-written number.
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(f"{self.share}\n")
        os.replace(partial, self.path)


def read_share(path: Path) -> int | None:
    """The share in ``path``; None when the file is missing or holds no positive integer (a
    process then keeps the threads it has)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


@contextmanager
def cores_shared(processes: int, cores: int | None = None) -> Iterator[CoreShare | None]:
    """``processes`` processes about to run side by side on ``cores`` (default: this machine's):
    inside, the processes started get ``cores // processes`` threads each (unless the caller
    set a thread variable), and, unless the caller set a thread count, the :class:`CoreShare`
    that hands a finished process's cores to those still running (None for one process).

    Side by side, each process needs its share: torch's default of one thread per core in each
    made two targets on 2 cores 3x slower than one after the other (measured: 326 s against
    110 s)."""
    cores = cores or os.cpu_count() or 1
    if processes <= 1:
        yield None
        return
    # A thread count the caller set stands: then no process's share changes as others end.
    caller_threads = any(variable in os.environ for variable in THREAD_VARIABLES)
    for variable in THREAD_VARIABLES:
        os.environ.setdefault(variable, str(max(1, cores // processes)))
    if caller_threads:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-cores-") as folder:
        yield CoreShare(cores, Path(folder) / "share")
