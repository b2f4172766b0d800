"""``# noqa`` comments: a bare ``# noqa`` silences every code on its line, ``# noqa: TB001,
TB004`` only those codes (the syntax flake8 and ruff share)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from no_tensor_truthiness.finding import Finding

NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)


def suppressed(findings: Sequence[Finding], lines: Sequence[str]) -> list[Finding]:
    """``findings`` without those whose line carries a ``noqa`` for their code, sorted."""
    kept = []
    for finding in findings:
        line = lines[finding.line - 1] if finding.line <= len(lines) else ""
        match = NOQA.search(line)
        if match is not None:
            codes = match.group("codes")
            if codes is None or finding.code in re.split(r"[\s,]+", codes.upper()):
                continue
        kept.append(finding)
    return sorted(set(kept))
