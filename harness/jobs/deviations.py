"""Known deviations: checks a target is known to fail, each with the reason.

One TOML file per target under ``fixtures/deviations/`` (``reference.toml``, ``vllm.toml``; the
``vllm-file:`` target uses ``vllm.toml``, since a pull request starts from the release)::

    [[deviation]]
    check = "suites/conformance/test_passthrough.py::test_name[param]"
    reason = "why the target fails it"
    raises = "ValueError"                 # the type of the exception that fails the check
                                          # ("IndexError | ValueError": one cause whose
                                          # exception type depends on the input)
    match = "data contains inconsistent"  # a regular expression its message must contain
    reach = "direct call"                 # how a user reaches it: see REACHES
    releases = ">=0.34.0"                 # optional: the vLLM releases it applies to

A deviation whose cause differs between releases (a crash in one, a wrong value in the next)
is two entries for the same check, one ``releases = "<X"`` and one ``releases = ">=X"``; a
target applies the entries whose range holds its installed vLLM (:func:`load_deviations`).

The cause is pinned: the check is an expected failure only while it fails with that exception
type and a message matching ``match`` (searched, ``^`` and ``$`` anchoring at every line, in
the message followed by one line ``<- Type: message`` per exception in its ``__cause__``
chain, so a wrapped cause can be pinned;
for an exception group, every exception in it must match, and for a check's several problems
(:class:`harness.problems.Problems`), every problem);
failing for another reason is a failure showing both causes. A fix upstream shows up as an
unexpected pass, which fails the run until the entry is removed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness import ROOT
from harness.problems import Problems
from harness.release_environments import RELEASE_RANGE, in_range, installed_release
from harness.toml_tables import string_tables

if TYPE_CHECKING:
    from harness.checkpoints.spec import ModelSpec
    from harness.inputs.requests import Request

DEVIATIONS_DIR = ROOT / "fixtures" / "deviations"
#: How a user reaches a deviation, as the report groups them.
REACHES = {
    "request": "a user's request reproduces it (prompt and media or embeddings through the "
    "engine's processor, batching and model)",
    "engine": "reached by building, configuring or loading the engine (a checkpoint, "
    "--hf-overrides), not per request",
    "direct call": "only a direct call of the model's methods reaches it: no request can, "
    "since the engine's processor and batching never produce that input (test_requests)",
}


class DeviationFileError(ValueError):
    """A deviation file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Deviation:
    check: str
    reason: str
    raises: str  # the exception type's name, or several separated by " | "
    match: str  # a regular expression searched in the exception's message and cause chain
    reach: str  # one of REACHES
    #: The shape of the requests the bug reaches (:data:`harness.inputs.shapes.REQUEST_SHAPES`):
    #: where set, a drawn request of that shape that fails with this cause is this bug's.
    drawn: str | None = None
    #: The vLLM releases it applies to (``"<0.34.0"``, ``">=0.34.0"``); None: every release.
    releases: str | None = None

    def applies_to(self, release: str | None) -> bool:
        """Whether the entry applies to vLLM ``release`` (None: no vLLM installed, where only
        entries for every release apply)."""
        if self.releases is None:
            return True
        return release is not None and in_range(release, self.releases)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.raises.split("|"))

    def cause_of(self, exc: BaseException) -> str | None:
        """None when ``exc`` is this deviation's cause; else what differs."""
        leaves = list(_leaves(exc))
        for leaf in leaves:
            if (
                type(leaf).__name__ not in self.types
                or re.search(self.match, chain(leaf), re.MULTILINE) is None
            ):
                return f"expected {self.raises} matching {self.match!r}, got " + "; ".join(
                    describe(e) for e in leaves
                )
        return None


def chain(exc: BaseException) -> str:
    """The message, then ``<- Type: message`` for each exception in the ``__cause__`` chain."""
    lines, seen = [str(exc)], {id(exc)}
    cause = exc.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        lines.append(f"<- {type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return "\n".join(lines)


def describe(exc: BaseException) -> str:
    """``Type: message`` in one line, shortened; an exception group as its exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(leaf) for leaf in _leaves(exc))
    message = " ".join(str(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    if exc.__cause__ is not None:
        message += f" (caused by {describe(exc.__cause__)})"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _leaves(exc: BaseException) -> list[BaseException]:
    """The failures a cause must explain each of: an exception group's exceptions, a check's
    several :class:`~harness.problems.Problems` one by one, else the exception itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    if isinstance(exc, Problems):
        return [AssertionError(problem) for problem in exc.each()]
    return [exc]


def explained_by(
    failure: BaseException | list[str],
    pinned: Sequence[Deviation],
    request: Request,
    spec: ModelSpec,
) -> str | None:
    """The check of the known deviation whose bug a drawn ``request`` on ``spec`` met, if any:
    a deviation of ``pinned`` that names the shape of the requests its bug reaches
    (:attr:`Deviation.drawn`), which ``request`` has, and whose pinned cause ``failure`` is (an
    exception, or a form's problems, each of which the cause must match). A deviation that
    names no shape excuses only the check it is pinned for: its message alone (a bare
    ``assert``, ``division by zero``) says nothing of which bug a drawn request met."""
    from harness.inputs.shapes import request_has_shape

    error = Problems("", failure) if isinstance(failure, list) else failure
    return next(
        (
            d.check
            for d in pinned
            if d.drawn is not None
            and request_has_shape(d.drawn, request, spec)
            and d.cause_of(error) is None
        ),
        None,
    )


def _shape_names() -> frozenset[str]:
    from harness.inputs.shapes import REQUEST_SHAPES

    return frozenset(REQUEST_SHAPES)


def deviations_path(name: str) -> Path:
    return DEVIATIONS_DIR / f"{name}.toml"


_INSTALLED = "installed"


def load_deviations(path: Path, release: str | None = _INSTALLED) -> dict[str, Deviation]:
    """The entries of a deviation file that apply to vLLM ``release`` (by default the
    installed one), by check id; a missing file means none."""
    if release == _INSTALLED:
        release = installed_release()
    return {d.check: d for d in all_deviations(path) if d.applies_to(release)}


def all_deviations(path: Path) -> list[Deviation]:
    """Every entry of a deviation file, each release's included; a missing file means none."""
    if not path.is_file():
        return []
    entries: dict[tuple[str, str | None], Deviation] = {}
    keys = frozenset({"check", "reason", "raises", "match", "reach"})
    optional = frozenset({"drawn", "releases"})
    for where, entry in string_tables(path, "deviation", keys, DeviationFileError, optional):
        check, reason = entry["check"], entry["reason"]
        raises, match = entry["raises"], entry["match"]
        if not isinstance(raises, str) or not all(
            name.strip().isidentifier() for name in raises.split("|")
        ):
            raise DeviationFileError(
                f"{where}: raises: expected an exception type's name (or several separated by "
                f"' | '), got {raises!r}"
            )
        try:
            re.compile(match)
        except (re.error, TypeError) as e:
            raise DeviationFileError(
                f"{where}: match: expected a regular expression, got {match!r} ({e})"
            ) from e
        if not isinstance(check, str) or "::" not in check:
            raise DeviationFileError(
                f"{where}: check: expected a test id 'path::name', got {check!r}"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise DeviationFileError(
                f"{where}: reason: expected a non-empty string, got {reason!r}"
            )
        reach = entry["reach"]
        if reach not in REACHES:
            raise DeviationFileError(
                f"{where}: reach: expected one of {list(REACHES)}, got {reach!r}"
            )
        releases = entry.get("releases")
        if releases is not None and not RELEASE_RANGE.match(releases):
            raise DeviationFileError(
                f"{where}: releases: expected '<X' or '>=X' with X a vLLM version such as "
                f"0.34.0, got {releases!r}"
            )
        others = [r for (c, r) in entries if c == check]
        if others and not _split_at_one_release([*others, releases]):
            raise DeviationFileError(
                f"{where}: check {check!r} is listed twice (two entries for one check must "
                "apply to releases on either side of one version: releases = '<X' and '>=X')"
            )
        drawn = entry.get("drawn")
        if drawn is not None and drawn not in _shape_names():
            raise DeviationFileError(
                f"{where}: drawn: expected a request shape of {sorted(_shape_names())}, got "
                f"{drawn!r}"
            )
        entries[(check, releases)] = Deviation(
            check, reason.strip(), raises, match, reach, drawn, releases
        )
    return list(entries.values())


def _split_at_one_release(ranges: list[str | None]) -> bool:
    """Whether two entries' ranges are ``<X`` and ``>=X`` for one ``X``."""
    if len(ranges) != 2 or None in ranges:
        return False
    first, second = sorted(r for r in ranges if r is not None)
    return first.startswith("<") and second.startswith(">=") and first[1:] == second[2:]
