"""Known deviations: checks a target is known to fail, each with the reason.

One TOML file per target under ``fixtures/deviations/`` (``reference.toml``, ``vllm.toml``; the
``vllm-file:`` target uses ``vllm.toml``, since a pull request starts from the release)::

    [[deviation]]
    check = "suites/conformance/test_passthrough.py::test_name[param]"
    reason = "why the target fails it"

They are applied as strict xfails: a fix upstream shows up as an unexpected pass, which fails the
run until the entry is removed.
"""

from __future__ import annotations

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
        if not isinstance(entry, dict) or set(entry) != {"check", "reason"}:
            raise DeviationFileError(
                f"{where}: expected the keys ['check', 'reason'], got {sorted(entry)}"
            )
        check, reason = entry["check"], entry["reason"]
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
        entries[check] = Deviation(check=check, reason=reason.strip())
    return entries
