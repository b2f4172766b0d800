"""Failures grouped by cause: a reviewer reads one line per cause, not one per check.

A failed check's *cause* is recorded when it fails (:func:`cause_of`, by the results plugin): the
exception's type and the frame it came from, the innermost frame of vLLM's code (a module named
``vllm`` or ``vllm.*``: the installed vLLM's, or a ``vllm-file:`` target's files, which load
under vLLM's module names); where no vLLM frame is on the traceback (a failed assertion of the
check itself), the innermost frame of the check's own module, the line of its failed assertion.
Checks with the same type and frame form one group (:func:`group_by_cause`), ordered by size; a
group whose exception a known deviation pins for another check says so (:func:`known_cause`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict

from harness.jobs.deviations import Deviation

#: The type and frame of a check whose failure recorded no traceback (a check a fault stopped:
#: a time or memory limit, a dead process), grouped by the first line of its reason.
UNRECORDED = "(no traceback recorded)"


class Cause(TypedDict):
    """Where a check's failure came from: the exception's type (``module.Name``, builtins bare),
    its frame (``vllm/…/file.py:LINE (function)`` or the check module's), its message's first
    line."""

    type: str
    frame: str
    message: str


def _type_name(kind: type[BaseException]) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _vllm_frame(module: str, path: str, line: int, function: str) -> str:
    """A frame of vLLM's code named by its module's path in vLLM's tree (the same for the
    installed vLLM and a ``vllm-file:`` copy of the file), its line and function."""
    stem = "__init__" if Path(path).name == "__init__.py" else None
    parts = module.split(".") + ([stem] if stem else [])
    return f"{'/'.join(parts)}.py:{line} ({function})"


def _root_relative(path: str, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return path


def cause_of(
    kind: type[BaseException],
    error: BaseException,
    traceback: TracebackType | None,
    check_file: Path,
    root: Path,
) -> Cause:
    """The cause of a failure raised as ``error`` (of type ``kind``) through ``traceback``, in a
    check defined in ``check_file``: the innermost frame of vLLM's code, else the innermost of
    ``check_file``, else the innermost of all (paths below ``root`` relative to it)."""
    frames: list[tuple[str, str, int, str]] = []  # module, path, line, function; outermost first
    while traceback is not None:
        code = traceback.tb_frame.f_code
        module = str(traceback.tb_frame.f_globals.get("__name__", ""))
        frames.append((module, code.co_filename, traceback.tb_lineno, code.co_qualname))
        traceback = traceback.tb_next
    message = str(error).strip().splitlines()
    cause = Cause(type=_type_name(kind), frame="(no frame)", message=message[0] if message else "")
    for module, path, line, function in reversed(frames):
        if module == "vllm" or module.startswith("vllm."):
            cause["frame"] = _vllm_frame(module, path, line, function)
            return cause
    check = check_file.resolve()
    for _, path, line, function in reversed(frames):
        if Path(path).resolve() == check:
            cause["frame"] = f"{_root_relative(path, root)}:{line} ({function})"
            return cause
    if frames:
        _, path, line, function = frames[-1]
        cause["frame"] = f"{_root_relative(path, root)}:{line} ({function})"
    return cause


def current_cause(check_file: Path, root: Path) -> Cause | None:
    """The cause of the exception being handled now (``sys.exc_info``), or None."""
    kind, error, traceback = sys.exc_info()
    if kind is None or error is None:
        return None
    return cause_of(kind, error, traceback, check_file, root)


@dataclass
class CauseGroup:
    """Failed checks of one cause: its exception type and frame, the first check's message,
    the checks' ids (in the order given), and the known deviation it is the cause of, if any."""

    type: str
    frame: str
    message: str
    ids: list[str] = field(default_factory=list)
    known: str | None = None


def read_cause(check: Mapping[str, Any]) -> Cause:
    """A check result's recorded cause; for one without (a check a fault stopped, results of an
    older harness) the unrecorded marker with its reason's first line as the frame."""
    recorded = check.get("cause")
    if isinstance(recorded, Mapping) and all(
        isinstance(recorded.get(k), str) for k in ("type", "frame", "message")
    ):
        return Cause(type=recorded["type"], frame=recorded["frame"], message=recorded["message"])
    reason = str(check.get("reason", "")).strip().splitlines()
    first = reason[0] if reason else "(no reason)"
    return Cause(type=UNRECORDED, frame=first[:200], message=first)


def group_by_cause(checks: Iterable[Mapping[str, Any]]) -> list[CauseGroup]:
    """Failed check results (each with ``id`` and, where recorded, ``cause``) grouped by their
    cause's type and frame: the largest group first, then by frame and type."""
    groups: dict[tuple[str, str], CauseGroup] = {}
    for check in checks:
        cause = read_cause(check)
        key = (cause["type"], cause["frame"])
        if key not in groups:
            groups[key] = CauseGroup(cause["type"], cause["frame"], cause["message"])
        groups[key].ids.append(str(check["id"]))
    return sorted(groups.values(), key=lambda g: (-len(g.ids), g.frame, g.type))


def known_cause(group: CauseGroup, deviations: Mapping[str, Deviation]) -> str | None:
    """The first known deviation of a check outside ``group`` that pins the group's exception
    (its ``raises`` the group's type, its ``match`` found in the group's message): that entry's
    check and reason, shortened."""
    short = group.type.rsplit(".", 1)[-1]
    for check, deviation in sorted(deviations.items()):
        if check in group.ids or not {group.type, short} & deviation.types:
            continue
        if re.search(deviation.match, group.message, re.MULTILINE):
            reason = " ".join(deviation.reason.split())
            return f"`{check}`: {reason[:200]}{'...' if len(reason) > 200 else ''}"
    return None
