"""Known deviations: checks a target is known to fail, each with the reason.

One TOML file per target under ``fixtures/deviations/`` (``reference.toml``, ``vllm.toml``; the
``vllm-file:`` target uses ``vllm.toml``, since a pull request starts from the release)::

    [[deviation]]
    check = "suites/conformance/test_passthrough.py::test_name[param]"
    reason = "why the target fails it"
    raises = "ValueError"                 # the type of the exception that fails the check
    match = "data contains inconsistent"  # a regular expression its message must contain

The cause is pinned: the check is an expected failure only while it fails with that exception
type and a message matching ``match`` (for an exception group, every exception in it must);
failing for another reason is a failure showing both causes. A fix upstream shows up as an
unexpected pass, which fails the run until the entry is removed.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT

DEVIATIONS_DIR = ROOT / "fixtures" / "deviations"


class DeviationFileError(ValueError):
    """A deviation file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Deviation:
    check: str
    reason: str
    raises: str  # the exception type's name
    match: str  # a regular expression searched in the exception's message

    def cause_of(self, exc: BaseException) -> str | None:
        """None when ``exc`` is this deviation's cause; else what differs."""
        leaves = list(_leaves(exc))
        for leaf in leaves:
            if type(leaf).__name__ != self.raises or re.search(self.match, str(leaf)) is None:
                return f"expected {self.raises} matching {self.match!r}, got " + "; ".join(
                    describe(e) for e in leaves
                )
        return None


def describe(exc: BaseException) -> str:
    """``Type: message`` in one line, shortened; an exception group as its exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(leaf) for leaf in _leaves(exc))
    message = " ".join(str(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def deviations_path(name: str) -> Path:
    return DEVIATIONS_DIR / f"{name}.toml"


def load_deviations(path: Path) -> dict[str, Deviation]:
    """Entries of a deviation file by check id; a missing file means none."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DeviationFileError(f"{path}: not valid TOML: {e}") from e
    unknown = set(data) - {"deviation"}
    if unknown:
        raise DeviationFileError(
            f"{path}: expected only [[deviation]] tables, got {sorted(unknown)}"
        )
    entries: dict[str, Deviation] = {}
    for i, entry in enumerate(data.get("deviation", [])):
        where = f"{path}: deviation #{i + 1}"
        keys = {"check", "reason", "raises", "match"}
        if not isinstance(entry, dict) or set(entry) != keys:
            raise DeviationFileError(
                f"{where}: expected the keys {sorted(keys)}, got {sorted(entry)}"
            )
        check, reason = entry["check"], entry["reason"]
        raises, match = entry["raises"], entry["match"]
        if not isinstance(raises, str) or not raises.isidentifier():
            raise DeviationFileError(
                f"{where}: raises: expected an exception type's name, got {raises!r}"
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
        if check in entries:
            raise DeviationFileError(f"{where}: check {check!r} is listed twice")
        entries[check] = Deviation(check, reason.strip(), raises, match)
    return entries
