"""The vLLM bugs the harness found, each reproduced against the installed vLLM.

Every script under ``reports/findings/`` reproduces one finding with vLLM's own objects on a
tiny checkpoint folder the harness writes; its ``main()`` returns 0 while the bug stands and 1
once it is gone. This module runs them all in one child process (vLLM imported once) and says,
per finding, reproduced, fixed or broken (the script itself failed), with what it printed::

    python -m harness.findings [--out reports/findings.md]

Exit status: 0 every finding reproduced; 1 one is fixed (its known deviation and script are due
for removal); 2 a script failed or vLLM is not installed.
"""

from __future__ import annotations

import argparse
import enum
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness import ROOT

FINDINGS = ROOT / "reports" / "findings"
START, END = "@@finding-start ", "@@finding-end "
#: How a reproduction states its verdict (its first line, where the message runs on).
VERDICTS = ("REPRODUCED", "NOT REPRODUCED")

#: Runs each script's ``main()`` in turn, fencing its output and its return value.
DRIVER = """
import runpy, sys, traceback
sys.path.insert(0, {folder!r})
for path in sys.argv[1:]:
    print({start!r} + path, flush=True)
    try:
        outcome = str(runpy.run_path(path, run_name="finding")["main"]())
    except BaseException as e:
        traceback.print_exc(file=sys.stdout)
        outcome = "error:" + type(e).__name__
    print({end!r} + path + " " + outcome, flush=True)
"""


class Status(enum.StrEnum):
    REPRODUCED = "reproduced"
    FIXED = "fixed"
    BROKEN = "broken"  # the script raised, or never reported


@dataclass(frozen=True)
class FindingRun:
    name: str
    status: Status
    said: str  # the script's verdict line (REPRODUCED: ... / NOT REPRODUCED: ...), or its last


def scripts(folder: Path = FINDINGS) -> list[Path]:
    """The reproductions (``_``-prefixed files are their shared set-up)."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def parse(output: str, paths: Sequence[Path]) -> list[FindingRun]:
    """Each script's outcome from the driver's fenced ``output``, in ``paths``' order."""
    said: dict[str, list[str]] = {}
    outcomes: dict[str, str] = {}
    current: str | None = None
    for line in output.splitlines():
        if line.startswith(START):
            current = line.removeprefix(START)
            said[current] = []
        elif line.startswith(END):
            ended, _, outcome = line.removeprefix(END).rpartition(" ")
            outcomes[ended] = outcome
            current = None
        elif current is not None and line.strip():
            said[current].append(line.strip())
    runs = []
    for path in paths:
        key = str(path)
        returned = outcomes.get(key, "")
        status = {"0": Status.REPRODUCED, "1": Status.FIXED}.get(returned, Status.BROKEN)
        lines = said.get(key) or ["(no output: the run stopped before this script ended)"]
        verdicts = [line for line in lines if line.startswith(VERDICTS)]
        runs.append(FindingRun(path.stem, status, (verdicts or lines)[-1]))
    return runs


def run_all(paths: Sequence[Path], timeout_s: float = 900.0) -> list[FindingRun]:
    """Every script of ``paths`` in one child process of this Python."""
    driver = DRIVER.format(folder=str(FINDINGS), start=START, end=END)
    try:
        done = subprocess.run(
            [sys.executable, "-c", driver, *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
        )
        output, errors = done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout
        output = stdout.decode() if isinstance(stdout, bytes) else (stdout or "")
        errors = f"timed out after {timeout_s:g} s"
    runs = parse(output, paths)
    last_error = next((line for line in reversed(errors.splitlines()) if line.strip()), "")
    return [
        FindingRun(run.name, run.status, f"{run.said} (stderr: {last_error})")
        if run.status == Status.BROKEN and last_error
        else run
        for run in runs
    ]


def render(runs: Sequence[FindingRun], vllm_version: str) -> str:
    lines = [
        f"# Findings against vLLM {vllm_version}",
        "",
        "| finding | status | what the reproduction said |",
        "|---|---|---|",
    ]
    for run in runs:
        said = run.said.replace("|", "\\|")[:300]
        lines.append(f"| `reports/findings/{run.name}.py` | {run.status} | {said} |")
    return "\n".join(lines) + "\n"


def exit_status(runs: Sequence[FindingRun]) -> int:
    statuses = {run.status for run in runs}
    if Status.BROKEN in statuses:
        return 2
    return 1 if Status.FIXED in statuses else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        print("harness.findings: vLLM is not installed: the reproductions run against it")
        return 2
    runs = run_all(scripts())
    table = render(runs, version)
    print(table, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return exit_status(runs)


if __name__ == "__main__":
    sys.exit(main())
