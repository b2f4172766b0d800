"""Why no check executes a line: each unreached line of the score's scope, with its reason.

The reach map (:mod:`harness.mutation.reach`) says which lines of the model family's CPU code no
check executes. ``fixtures/unreached.toml`` says why, one entry per function and lines::

    [[unreached]]
    function = "vllm/model_executor/models/nano_nemotron_vl.py:NemotronH_Nano_VL_V2.forward"
    lines = "1575-1576, 1578, 1586"
    reason = "gpu"
    why = "the language model's forward pass, which needs vLLM's GPU kernels"

A reason is one of :data:`REASONS`. :func:`explain` joins them with a map: every unreached line
gets its entry's reason, a line no entry names is *unexplained* (it needs a reason or a check),
and a line an entry names that a check now executes is *stale* (the entry should go).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.release_environments import RELEASE_RANGE, in_range, installed_release
from harness.toml_tables import string_tables

UNREACHED_FILE = ROOT / "fixtures" / "unreached.toml"
#: Why a line runs in no check, and what that means.
REASONS = {
    "gpu": "runs only in the language model's forward pass, CUDA graphs or other GPU-only paths",
    "engine": "called only by vLLM's engine outside a request (profiling, warm-up, scheduling)",
    "option": "reached only under a config value or serving option no variant sets",
    "input": "reached only with an input form no check sends",
    "defensive": "an error branch for state no request can produce",
    "dead": "no caller in the installed vLLM",
}
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


class UnreachedFileError(ValueError):
    """``fixtures/unreached.toml`` is malformed; the message names the entry and the field."""


def parse_lines(text: str, where: str) -> frozenset[int]:
    """``"3-5, 9"`` -> ``{3, 4, 5, 9}``; a clear error naming ``where`` otherwise."""
    lines: set[int] = set()
    for part in text.split(","):
        found = _RANGE.match(part)
        if found is None:
            raise UnreachedFileError(
                f"{where}: lines: expected ranges such as '3-5, 9', got {text!r}"
            )
        first, last = int(found[1]), int(found[2] or found[1])
        if last < first:
            raise UnreachedFileError(f"{where}: lines: a range ends before it starts: {part!r}")
        lines.update(range(first, last + 1))
    return frozenset(lines)


@dataclass(frozen=True)
class Explanation:
    """Why no check executes ``lines`` of ``function`` (``file:Qualified.name``)."""

    function: str
    lines: frozenset[int]
    reason: str
    why: str


_INSTALLED = "installed"


def load_explanations(
    path: Path = UNREACHED_FILE, release: str | None = _INSTALLED
) -> list[Explanation]:
    """The entries of ``path`` for vLLM ``release`` (by default the installed one; None: every
    entry): line numbers are a release's files', so an entry says which releases it is for
    (``releases = "<0.34.0"``, as a known deviation does; none: every release). Every
    malformed entry raises :class:`UnreachedFileError`."""
    if not path.is_file():
        return []
    if release == _INSTALLED:
        release = installed_release()
    entries = []
    keys = frozenset({"function", "lines", "reason", "why"})
    tables = string_tables(path, "unreached", keys, UnreachedFileError, frozenset({"releases"}))
    for where, entry in tables:
        releases = entry.get("releases")
        if releases is not None and not RELEASE_RANGE.match(releases):
            raise UnreachedFileError(
                f"{where}: releases: expected '<X' or '>=X' with X a vLLM version such as "
                f"0.34.0, got {releases!r}"
            )
        if ":" not in entry["function"]:
            raise UnreachedFileError(
                f"{where}: function: expected 'FILE:Qualified.name', got {entry['function']!r}"
            )
        if entry["reason"] not in REASONS:
            raise UnreachedFileError(
                f"{where}: reason: expected one of {sorted(REASONS)}, got {entry['reason']!r}"
            )
        explanation = Explanation(
            entry["function"],
            parse_lines(entry["lines"], where),
            entry["reason"],
            entry["why"].strip(),
        )
        if release is None or in_range(release, releases):
            entries.append(explanation)
    return entries


@dataclass
class Explained:
    """The unreached lines of one function: each explained range, and those no entry names."""

    function: str
    explained: list[tuple[list[int], str, str]] = field(default_factory=list)
    unexplained: list[int] = field(default_factory=list)


@dataclass
class UnreachedReport:
    functions: list[Explained]
    stale: list[tuple[str, list[int]]]  # entries' lines that a check now executes

    def counts(self) -> dict[str, int]:
        """Unreached lines per reason (``unexplained`` for those with none)."""
        counts: dict[str, int] = {}
        for function in self.functions:
            for lines, reason, _ in function.explained:
                counts[reason] = counts.get(reason, 0) + len(lines)
            if function.unexplained:
                counts["unexplained"] = counts.get("unexplained", 0) + len(function.unexplained)
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts(),
            "functions": [
                {
                    "function": f.function,
                    "explained": [
                        {"lines": lines, "reason": reason, "why": why}
                        for lines, reason, why in f.explained
                    ],
                    "unexplained": f.unexplained,
                }
                for f in self.functions
            ],
            "stale": [{"function": name, "lines": lines} for name, lines in self.stale],
        }


def explain(
    unreached: Iterable[tuple[str, Sequence[int]]], explanations: Sequence[Explanation]
) -> UnreachedReport:
    """Each function's unreached lines (``(function, lines)``) joined with ``explanations``."""
    by_function: dict[str, list[Explanation]] = {}
    for entry in explanations:
        by_function.setdefault(entry.function, []).append(entry)
    functions = []
    named: dict[str, set[int]] = {}
    for name, lines in unreached:
        result = Explained(name)
        left = set(lines)
        for entry in by_function.get(name, []):
            covered = sorted(left & entry.lines)
            if covered:
                result.explained.append((covered, entry.reason, entry.why))
                left -= entry.lines
        named[name] = set(lines)
        result.unexplained = sorted(left)
        functions.append(result)
    stale = []
    for entry in explanations:
        reached_now = sorted(entry.lines - named.get(entry.function, set()))
        if reached_now:
            stale.append((entry.function, reached_now))
    return UnreachedReport(functions, stale)


def report_lines(report: dict[str, Any]) -> list[str]:
    """Markdown of an :class:`UnreachedReport` (its JSON form): every unreached line range with
    its reason, the unexplained ones first."""
    from harness.mutation.reach import line_ranges

    lines = [
        "### Why no check reaches them",
        "",
        "Each unreached line with its reason (`fixtures/unreached.toml`): "
        + "; ".join(f"{reason}: {meaning}" for reason, meaning in REASONS.items())
        + ".",
        "",
        "| reason | lines |",
        "|---|---|",
        *(f"| {reason} | {n} |" for reason, n in sorted(report["counts"].items())),
        "",
        "| function | lines | reason | why |",
        "|---|---|---|---|",
    ]
    for function in report["functions"]:
        if function["unexplained"]:
            lines.append(
                f"| `{function['function']}` | {line_ranges(function['unexplained'])} | "
                "**unexplained** | needs a reason or a check |"
            )
    for function in report["functions"]:
        for entry in function["explained"]:
            why = entry["why"].replace("|", "\\|")
            lines.append(
                f"| `{function['function']}` | {line_ranges(entry['lines'])} | "
                f"{entry['reason']} | {why} |"
            )
    if report["stale"]:
        lines += ["", "Entries naming lines a check now executes (remove them):", ""]
        lines += [f"- `{e['function']}`: {line_ranges(e['lines'])}" for e in report["stale"]]
    return lines
