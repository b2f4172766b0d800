"""One page from a GPU run's folder: ``nemotron-vl-gpu-summary OUT``.

Reads what ``scripts/gpu_checks.sh`` wrote to ``OUT``: the JUnit XML of each pytest step (each
check's outcome, time, skip or failure message and the numbers it measured: the ``measured``
property), ``kernel-route.json`` (how vLLM's kernels were reached), ``throughput.json`` and
``steps.tsv`` (each step's exit status and seconds). Writes ``OUT/summary.md`` and prints it.
Exit status 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import ast
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.gpu.throughput import table


@dataclass
class Case:
    name: str
    outcome: str
    seconds: float
    message: str = ""
    measured: dict[str, Any] = field(default_factory=dict)


def read_junit(path: Path) -> list[Case]:
    """Every test case of a JUnit XML file (pytest's), with its ``measured`` property."""
    cases = []
    for element in ET.parse(path).getroot().iter("testcase"):
        name = f"{element.get('classname', '')}::{element.get('name', '')}".split(".")[-1]
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = element.find(kind)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                text = (found.get("message") or found.text or "").strip()
                message = text.splitlines()[0] if text else ""
                break
        measured: dict[str, Any] = {}
        for prop in element.iter("property"):
            if prop.get("name") == "measured":
                value = ast.literal_eval(prop.get("value") or "{}")
                measured = value if isinstance(value, dict) else {}
        cases.append(Case(name, outcome, float(element.get("time") or 0.0), message, measured))
    return cases


def _number(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, float) else str(value)


def summarise(out: Path) -> tuple[str, bool]:
    """The page, and whether every step passed."""
    lines = [f"# GPU run: {out}", ""]
    ok = True
    environment = out / "environment.txt"
    if environment.is_file():
        lines += ["```", environment.read_text().strip(), "```", ""]
    steps = out / "steps.tsv"
    if steps.is_file():
        lines += ["| step | exit | seconds |", "|---|---|---|"]
        for row in steps.read_text().splitlines():
            name, status, seconds = row.split("\t")
            ok = ok and status == "0"
            note = " (timed out)" if status in ("124", "137") else ""
            lines.append(f"| {name} | {status}{note} | {seconds} |")
        lines.append("")
    route = out / "kernel-route.json"
    if route.is_file():
        record = json.loads(route.read_text())
        if record.get("loaded"):
            lines.append(f"vLLM's kernels: {record['route']} from {record['source']}")
            if record.get("package_refused"):
                lines.append(f"- vLLM's package not used: {record['package_refused']}")
            lines += [f"- stand-in {k}: {v}" for k, v in record.get("stand_ins", {}).items()]
        else:
            lines.append(f"vLLM's kernels could not be loaded: {record.get('error')}")
        lines.append("")
    for junit in sorted(out.glob("junit-*.xml")):
        cases = read_junit(junit)
        counts = Counter(case.outcome for case in cases)
        lines += [f"## {junit.name}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))]
        measured = [case for case in cases if case.measured]
        if measured:
            lines += ["", "| check | outcome | measured |", "|---|---|---|"]
            for case in measured:
                # A check's headline number when it has one; its details stay in the XML.
                shown = case.measured
                if "max_relative_error" in shown:
                    shown = {"max_relative_error": shown["max_relative_error"]}
                values = ", ".join(f"{k} {_number(v)}" for k, v in shown.items())
                lines.append(f"| {case.name} | {case.outcome} | {values} |")
        problems = [case for case in cases if case.outcome in ("failed", "error")]
        ok = ok and not problems
        lines += [f"- {case.outcome}: {case.name}: {case.message}" for case in problems]
        reasons = Counter(case.message for case in cases if case.outcome == "skipped")
        lines += [f"- skipped {n}: {reason}" for reason, n in reasons.items()]
        lines.append("")
    throughput = out / "throughput.json"
    if throughput.is_file():
        lines += ["## Throughput (bf16)", "", table(json.loads(throughput.read_text())), ""]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: nemotron-vl-gpu-summary OUT (a GPU run's folder)", file=sys.stderr)
        return 2
    out = Path(args[0])
    page, ok = summarise(out)
    (out / "summary.md").write_text(page + "\n")
    print(page)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
