"""Output formats: text (``path:line:col: CODE message``), json, github annotations, SARIF."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from no_tensor_truthiness.finding import Finding
from no_tensor_truthiness.rules import RULES

FORMATS = ("text", "json", "github", "sarif")
TOOL = "no-tensor-truthiness"
HELP_URI = "https://github.com/vllm-project/vllm/pull/56398"


def render(findings: Sequence[Finding], fmt: str) -> str:
    if fmt == "text":
        return "".join(f.format() + "\n" for f in findings)
    if fmt == "json":
        return (
            json.dumps(
                [
                    {
                        "path": f.path,
                        "line": f.line,
                        "column": f.col,
                        "end_line": f.end_line,
                        "end_column": f.end_col,
                        "code": f.code,
                        "message": f.message,
                        # Unsafe (changes behaviour for some input): `--fix --unsafe-fixes`.
                        "fix": None
                        if f.fix is None
                        else {**asdict(f.fix), "applicability": "unsafe"},
                    }
                    for f in findings
                ],
                indent=2,
            )
            + "\n"
        )
    if fmt == "github":
        return "".join(
            f"::error file={f.path},line={f.line},col={f.col},endLine={f.end_line or f.line},"
            f"endColumn={f.end_col or f.col},title={TOOL} {f.code}::{_escape(f.message)}\n"
            for f in findings
        )
    if fmt == "sarif":
        return json.dumps(_sarif(findings), indent=2) + "\n"
    raise ValueError(f"format: expected one of {FORMATS}, got {fmt!r}")


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _sarif(findings: Sequence[Finding]) -> dict[str, object]:
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": TOOL,
                        "informationUri": HELP_URI,
                        "rules": [
                            {
                                "id": rule.code,
                                "name": rule.name,
                                "shortDescription": {"text": rule.context},
                                "fullDescription": {"text": rule.what},
                                "help": {"text": rule.doc(), "markdown": rule.doc()},
                            }
                            for rule in RULES.values()
                        ],
                    }
                },
                "results": [
                    {
                        "ruleId": f.code,
                        "level": "error",
                        "message": {"text": f.message},
                        "locations": [
                            {
                                "physicalLocation": {
                                    "artifactLocation": {"uri": f.path},
                                    "region": {
                                        "startLine": f.line,
                                        "startColumn": f.col,
                                        "endLine": f.end_line or f.line,
                                        "endColumn": f.end_col or f.col,
                                    },
                                }
                            }
                        ],
                    }
                    for f in findings
                ],
            }
        ],
    }
