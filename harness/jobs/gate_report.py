"""The gate's two sides compared check by check (:func:`compare`), and its delta report
(``gate.md``, and the regressions of ``gate.json``): its verdict, each
side's run, the regressions grouped by cause (:mod:`harness.jobs.causes`: one group per exception
type and frame of vLLM's code, the largest first, each with its count, frame, first message, the
known deviation it is the cause of elsewhere, and one command that reruns the group), the fixed
known deviations, the other fixes, new and removed checks, and the unchanged rest; for each
leg (:class:`Leg`: the conformance suites over the installed vLLM, then the engine and server
suites over the CPU build), each rerun command naming its leg's Python and target."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.jobs.causes import CauseGroup, group_by_cause, known_cause
from harness.jobs.deviations import deviations_path, load_deviations
from harness.jobs.report import TargetRun
from harness.jobs.report import verdict as run_verdict
from harness.jobs.results import Outcome
from harness.jobs.runtimes import ENGINE_FILE_TARGET, ENGINE_TARGET, engine_python
from harness.jobs.scope import Scope

FAILED = (Outcome.FAIL.value, Outcome.ERROR.value)

#: A regression's message is cut to this in the Markdown (whole in gate.json).
MESSAGE_CHARS = 300
#: The checks of a group the Markdown lists by name (all of them in its rerun file).
LISTED_PER_GROUP = 5


@dataclass
class Side:
    name: str  # "base" or "head"
    rev: str  # a revision, or "working tree"
    files: list[Path]
    run: TargetRun
    seconds: float
    cached: bool = False

    @property
    def status(self) -> str:
        return run_verdict(self.run).status.value

    @property
    def outcomes(self) -> dict[str, dict[str, Any]]:
        return {c["id"]: dict(c) for c in self.run.checks}


@dataclass
class Delta:
    regressions: list[dict[str, Any]] = field(default_factory=list)
    fixed_deviations: list[dict[str, Any]] = field(default_factory=list)
    fixes: list[dict[str, Any]] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: dict[str, int] = field(default_factory=dict)


def compare(base: dict[str, dict[str, Any]], head: dict[str, dict[str, Any]]) -> Delta:
    """Check by check, the base's outcome against the head's."""
    delta = Delta()
    for check in sorted(set(base) | set(head)):
        b, h = base.get(check), head.get(check)
        if b is None:
            delta.new.append(check)
        elif h is None:
            delta.removed.append(check)
        elif h["outcome"] in FAILED and b["outcome"] not in FAILED:
            delta.regressions.append({"id": check, "base": b["outcome"], "head": h})
        elif h["outcome"] == Outcome.XPASS and b["outcome"] != Outcome.XPASS:
            delta.fixed_deviations.append({"id": check, "base": b["outcome"], "head": h})
        elif b["outcome"] in FAILED and h["outcome"] not in FAILED:
            delta.fixes.append({"id": check, "base": b["outcome"], "head": h})
        else:
            key = h["outcome"] if h["outcome"] == b["outcome"] else f"{b['outcome']}→{h['outcome']}"
            delta.unchanged[key] = delta.unchanged.get(key, 0) + 1
    return delta


def selector_for(files: list[Path]) -> str:
    """The side's target: its files over the installed vLLM, or the installed vLLM itself."""
    return "vllm-file:" + ",".join(str(f) for f in files) if files else "vllm"


def engine_selector_for(files: list[Path]) -> str:
    """The engine leg's target: its files in every process of the CPU build's engine."""
    return ENGINE_FILE_TARGET + ",".join(str(f) for f in files) if files else ENGINE_TARGET


def is_engine(selector: str) -> bool:
    return selector == ENGINE_TARGET or selector.startswith(ENGINE_FILE_TARGET)


def python_for(selector: str) -> str:
    """The Python a rerun command names: the engine environment's for the engine leg."""
    found = engine_python() if is_engine(selector) else None
    return str(found) if found is not None else "python"


def _pytest_command(what: str, head: Side) -> str:
    selector = head.run.selector
    return shlex.join([python_for(selector), "-m", "pytest", what, f"--target={selector}"])


def rerun_command(check: str, head: Side) -> str:
    """The command that reruns one check on the head's files (in its leg's environment)."""
    return _pytest_command(check, head)


def group_rerun_command(ids_file: Path, head: Side) -> str:
    """The command that reruns a group's checks (their ids one per line in ``ids_file``: pytest
    reads arguments from a file named with ``@``) on the head's files."""
    return _pytest_command(f"@{ids_file}", head)


def group_regressions(
    delta: Delta, folder: Path, deviations_name: str = "vllm"
) -> list[tuple[CauseGroup, Path]]:
    """The delta's regressions grouped by cause, each group's known deviation (of the
    ``deviations_name`` target's file) found, and each group's check ids written to
    ``folder/K.txt`` (K from 1, the largest group first)."""
    groups = group_by_cause(entry["head"] for entry in delta.regressions)
    if not groups:
        return []
    deviations = load_deviations(deviations_path(deviations_name))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for k, group in enumerate(groups, start=1):
        group.known = known_cause(group, deviations)
        ids_file = folder / f"{k}.txt"
        ids_file.write_text("".join(f"{check}\n" for check in group.ids))
        written.append((group, ids_file))
    return written


def regressions_document(
    delta: Delta, groups: list[tuple[CauseGroup, Path]], head: Side
) -> dict[str, Any]:
    """gate.json's regressions, each with its rerun command, and their groups by cause."""
    return {
        "regressions": [e | {"rerun": rerun_command(e["id"], head)} for e in delta.regressions],
        "groups": [
            {
                "type": group.type,
                "frame": group.frame,
                "count": len(group.ids),
                "message": group.message,
                "known": group.known,
                "ids": group.ids,
                "rerun": group_rerun_command(ids_file, head),
            }
            for group, ids_file in groups
        ],
    }


def _in_scope_because(path: str, scope: Scope | None, engine_scope: Scope | None = None) -> str:
    functions = scope.files.get(path, {}) if scope is not None else {}
    if functions:
        checks = set().union(*(f.checks for f in functions.values()))
        return f"{len(functions)} of its functions run by {len(checks)} checks"
    engine = engine_scope.files.get(path, {}) if engine_scope is not None else {}
    if engine:
        suites = set().union(*(f.checks for f in engine.values()))
        names = ", ".join(engine_scope.checks[i] for i in sorted(suites)) if engine_scope else ""
        return f"{len(engine)} of its functions run by vLLM's engine under {names}"
    return "the model's own"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _group_lines(k: int, group: CauseGroup, ids_file: Path, head: Side, level: str) -> list[str]:
    count = len(group.ids)
    lines = [
        f"{level} {k}. {count} check{'s' if count != 1 else ''}: `{group.type}` from "
        f"`{group.frame}`",
        "",
        f"- first message: {_short(group.message)}",
    ]
    if group.known:
        lines.append(f"- a known deviation's cause elsewhere: {group.known}")
    lines.append(f"- rerun the group: `{group_rerun_command(ids_file, head)}`")
    lines += [f"- `{check}`" for check in group.ids[:LISTED_PER_GROUP]]
    if count > LISTED_PER_GROUP:
        lines.append(f"- ... {count - LISTED_PER_GROUP} more (all in `{ids_file.name}`)")
    return [*lines, ""]


@dataclass
class Leg:
    """One leg of the gate (the conformance suites over the installed vLLM, or the engine and
    server suites over the CPU build): its two sides, their delta and its groups by cause."""

    base: Side
    head: Side
    delta: Delta
    groups: list[tuple[CauseGroup, Path]]
    deviations_name: str = "vllm"


def side_lines(leg: Leg) -> list[str]:
    lines = []
    for side in (leg.base, leg.head):
        problem = run_verdict(side.run).problem
        problem = f" — {problem}" if problem else ""
        how = "cached results" if side.cached else f"{side.seconds:g} s"
        lines.append(f"- {side.name} ({side.rev}): {side.status}{problem} ({how})")
    return lines


def leg_lines(leg: Leg, level: str = "##") -> list[str]:
    """A leg's regressions by cause, fixed known deviations, other fixes, new and removed
    checks and the unchanged rest, its headings at ``level``."""
    delta, groups = leg.delta, leg.groups
    lines = [
        f"{level} Regressions ({len(delta.regressions)}) in {len(groups)} group(s) by cause",
        "",
    ]
    for k, (group, ids_file) in enumerate(groups, start=1):
        lines += _group_lines(k, group, ids_file, leg.head, level + "#")
    deviation_file = deviations_path(leg.deviations_name).relative_to(ROOT)
    lines += [
        f"{level} Fixed known deviations ({len(delta.fixed_deviations)}): delete their entries "
        f"from `{deviation_file}`",
        "",
    ]
    lines += [f"- `{entry['id']}`" for entry in delta.fixed_deviations]
    lines += ["", f"{level} Other fixes ({len(delta.fixes)})", ""]
    lines += [
        f"- `{entry['id']}`: {entry['base']} → {entry['head']['outcome']}" for entry in delta.fixes
    ]
    if delta.new or delta.removed:
        lines += [
            "",
            f"{level} New checks ({len(delta.new)}), removed checks ({len(delta.removed)})",
            "",
        ]
        lines += [f"- new: `{c}`" for c in delta.new] + [f"- removed: `{c}`" for c in delta.removed]
    unchanged = ", ".join(f"{n} {what}" for what, n in sorted(delta.unchanged.items()))
    lines += ["", f"Unchanged: {sum(delta.unchanged.values())} checks ({unchanged or 'none'}).", ""]
    return lines


#: The engine leg's heading in the delta report.
ENGINE_LEG_TITLE = "The engine leg: vLLM's engine and server on its CPU build"


def render(
    repo: Path,
    touched: list[str],
    leg: Leg | None,
    status: int,
    scope: Scope | None = None,
    notes: list[str] | None = None,
    engine: Leg | None = None,
    engine_notes: list[str] | None = None,
    *,
    revs: tuple[str, str] | None = None,
    engine_scope: Scope | None = None,
) -> str:
    """The delta report: the verdict, the files in scope, the conformance leg (None: not run,
    ``notes`` say why; ``revs`` name the sides then) and the engine leg."""
    regressions = sum(len(x.delta.regressions) for x in (leg, engine) if x is not None)
    verdict = {
        0: "no regression",
        1: f"{regressions} regression(s)",
        2: "a side could not run",
    }[status]
    base, head = (leg.base.rev, leg.head.rev) if leg is not None else (revs or ("?", "?"))
    lines = [
        f"# Gate: `{repo}` {base} → {head}",
        "",
        f"**{verdict}** (exit status {status}). Files touched that the checks run: "
        + ", ".join(f"`{p}` ({_in_scope_because(p, scope, engine_scope)})" for p in touched)
        + ".",
        "",
        *(side_lines(leg) if leg is not None else []),
        *[f"- {note}" for note in notes or []],
        "",
        *(leg_lines(leg) if leg is not None else []),
        f"## {ENGINE_LEG_TITLE}",
        "",
        *[f"- {note}" for note in engine_notes or []],
    ]
    if engine is not None:
        lines += [*side_lines(engine), "", *leg_lines(engine, "###")]
    return "\n".join(lines) + ("\n" if engine is None else "")
