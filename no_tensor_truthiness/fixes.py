"""Applying the lint's fixes to a file's text, the way ruff applies unsafe fixes.

Every fix rewrites a truth test (``x`` -> ``x is not None``, ``x.numel() > 0``, ``(x > 0).all()``)
and so changes behaviour for some input: all are *unsafe* in ruff's sense, applied only with
``--fix --unsafe-fixes`` and shown by ``--diff --unsafe-fixes``. Overlapping fixes wait for the
next round; rounds repeat until no fix is left (at most :data:`MAX_ROUNDS`), so fixing is
idempotent. A round whose result would not parse is dropped: a fix never writes a broken file.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from no_tensor_truthiness.checker import check_source
from no_tensor_truthiness.evaluation import DEFAULT_TENSOR_KEY
from no_tensor_truthiness.finding import Finding, Fix

MAX_ROUNDS = 10
_LINE_START = re.compile(r"\r\n|\r|\n")  # the line breaks `ast` counts lines by


@dataclass
class FixResult:
    """The fixed text, how many fixes went in, and the findings left in it."""

    source: str
    applied: int = 0
    remaining: list[Finding] = field(default_factory=list)
    refused: str = ""  # why a round was dropped, if one was

    def diff(self, original: str, path: str) -> str:
        return "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                self.source.splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )


def apply_fixes(source: str, fixes: Sequence[Fix]) -> tuple[str, int]:
    """``source`` with every fix that does not overlap an earlier one applied; how many were."""
    starts = [0] + [m.end() for m in _LINE_START.finditer(source)]

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col if line <= len(starts) else len(source)

    spans = sorted(
        (offset(f.line, f.col), offset(f.end_line, f.end_col), f.replacement) for f in fixes
    )
    pieces, cursor, applied = [], 0, 0
    for start, end, replacement in spans:
        if start < cursor:  # overlaps the previous fix: next round
            continue
        pieces += [source[cursor:start], replacement]
        cursor = end
        applied += 1
    pieces.append(source[cursor:])
    return "".join(pieces), applied


def fix_source(
    source: str,
    path: str,
    *,
    tensor_key: str = DEFAULT_TENSOR_KEY,
    enabled: Callable[[str], bool] = lambda code: True,
) -> FixResult:
    """Apply every fix of the enabled rules to ``source`` until none is left."""
    result = FixResult(source)
    for _ in range(MAX_ROUNDS):
        findings = [f for f in check_source(result.source, path, tensor_key) if enabled(f.code)]
        fixes = [f.fix for f in findings if f.fix is not None]
        if not fixes:
            break
        fixed, applied = apply_fixes(result.source, fixes)
        try:
            ast.parse(fixed)
        except SyntaxError as e:  # a bug in a fix: keep the last good text
            result.refused = f"a fix would not parse ({e.msg}, line {e.lineno}); not applied"
            break
        if fixed == result.source:
            break
        result.source, result.applied = fixed, result.applied + applied
    result.remaining = [f for f in check_source(result.source, path, tensor_key) if enabled(f.code)]
    return result
