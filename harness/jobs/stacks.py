"""Where a running check is: the innermost Python frame of a target process's main thread, asked
for from outside while the check runs.

A target process that keeps a progress file (``--progress-file PROGRESS``) answers
:data:`STACK_SIGNAL` by appending every thread's stack to ``PROGRESS.stack``
(:func:`answer_stack_requests`). The answer is :mod:`faulthandler`'s, written by its C signal
handler: it comes from a process stuck in a loop of compiled code or in a deadlock alike, since
no Python code has to run. The file starts with the main thread's id, so that the supervisor
(:func:`where`) reads the main thread's frames among the others.

The supervisor uses it twice (:mod:`harness.jobs.supervisor`): a check that times out is
reported with where it was stuck, and after a timeout a check past the shorter derived limit is
killed only if it is stuck in a function where a check that timed out was (the same fault on a
shared path); a check elsewhere is an honest slow one (a loaded machine, a process that builds
its models again) and keeps the full limit. A check that waits on another process (vLLM's
engine, a server) waits in the same function whatever that process does: such checks are told
apart no better than by the derived limit alone.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: The signal a target process answers with its stacks (unused by pytest, torch and vLLM).
STACK_SIGNAL = signal.SIGUSR2
#: The longest the supervisor waits for an answer (faulthandler's takes milliseconds).
ANSWER_S = 2.0
_POLL_S = 0.02
#: Polls a dump must stay unchanged to be read (100 ms).
_SETTLED_POLLS = 5
_HEADER = "main thread "
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (\S+)$')
#: The open answer file of this process (kept open for faulthandler, which writes to its fd).
_ANSWERS: list[IO[str]] = []


@dataclass(frozen=True)
class Site:
    """A frame: the file, the line and the function a thread is in."""

    path: str
    line: int
    function: str

    @property
    def place(self) -> tuple[str, str]:
        """The function it is in: a loop that calls functions is on another line at each look,
        in the same function."""
        return (self.path, self.function)

    def __str__(self) -> str:
        return f"{_short(self.path)}:{self.line} in {self.function}"


def _short(path: str) -> str:
    """A path as a reader knows it: from its package (``vllm/...``) when installed."""
    marker = f"{os.sep}site-packages{os.sep}"
    return path.split(marker, 1)[1] if marker in path else path


def stack_file(progress: Path) -> Path:
    return progress.with_name(progress.name + ".stack")


def answer_stack_requests(progress: Path) -> None:
    """In a target process: answer :data:`STACK_SIGNAL` with every thread's stack, appended to
    ``PROGRESS.stack`` (which starts with the main thread's id). A file that cannot be written
    leaves the process unable to answer, never unable to run: without the file's header the
    supervisor does not ask (:func:`where`)."""
    path = stack_file(progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as the progress file's is made
        answers = path.open("w")
        main = threading.main_thread().ident or 0
        answers.write(f"{_HEADER}0x{main:016x}\n")
        answers.flush()
    except OSError:
        return
    faulthandler.register(STACK_SIGNAL, file=answers, all_threads=True, chain=False)
    _ANSWERS[:] = [answers]


def where(pid: int, progress: Path, timeout_s: float = ANSWER_S) -> Site | None:
    """Where process ``pid``'s main thread is (:func:`innermost_frame`), asked for now; None
    when the process does not answer (it keeps no answer file, so the signal, which would end
    it, is not sent; or no whole answer came within ``timeout_s``)."""
    path = stack_file(progress)
    try:
        before = path.read_text()
    except OSError:
        return None
    if not before.startswith(_HEADER):
        return None
    main = before[len(_HEADER) :].split("\n", 1)[0].strip()
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return None
    deadline = time.monotonic() + timeout_s
    seen, unchanged = "", 0
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        try:
            answer = path.read_text()[len(before) :]
        except OSError:
            return None
        # faulthandler writes piece by piece, the main thread last: a dump is read once it has
        # the main thread's frames and stopped growing (a writer preempted on a loaded machine
        # pauses mid-dump).
        unchanged = unchanged + 1 if answer == seen else 0
        seen = answer
        site = innermost_frame(answer, main)
        if site is not None and unchanged >= _SETTLED_POLLS:
            return site
    return None


#: Frames of the standard library are where any wait ends up (a lock, a queue, a socket): the
#: place a thread is stuck is its innermost frame outside it.
_STANDARD_LIBRARY = sysconfig.get_paths()["stdlib"] + os.sep


def _standard(path: str) -> bool:
    return path.startswith(_STANDARD_LIBRARY) and "site-packages" not in path


def innermost_frame(dump: str, thread: str) -> Site | None:
    """Where ``thread`` is in a faulthandler dump: its innermost frame outside the standard
    library (its innermost frame if all are in it); None when the dump holds no whole frame of
    that thread."""
    frames: list[Site] = []
    current = None
    for line in dump.splitlines():
        header = _THREAD.match(line)
        if header is not None:
            current = header.group(1)
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None and int(current, 16) == int(thread, 16):
            frames.append(Site(frame.group(1), int(frame.group(2)), frame.group(3)))
    if not frames:
        return None
    return next((site for site in frames if not _standard(site.path)), frames[0])
