"""The gate's two sides compared check by check (:func:`compare`), and its delta report
(``gate.md``, and the regressions of ``gate.json``): its verdict, each
side's run, the regressions grouped by cause (:mod:`harness.jobs.causes`: one group per exception
type and frame of vLLM's code, the largest first, each with its count, frame, first message, the
known deviation it is the cause of elsewhere, and one command that reruns the group), the fixed
known deviations, the other fixes, new and removed checks, and the unchanged rest."""

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


def rerun_command(check: str, head: Side) -> str:
    """The command that reruns one check on the head's files."""
    return shlex.join(["python", "-m", "pytest", check, f"--target={selector_for(head.files)}"])


def group_rerun_command(ids_file: Path, head: Side) -> str:
    """The command that reruns a group's checks (their ids one per line in ``ids_file``: pytest
    reads arguments from a file named with ``@``) on the head's files."""
    return shlex.join(
        ["python", "-m", "pytest", f"@{ids_file}", f"--target={selector_for(head.files)}"]
    )


def group_regressions(delta: Delta, folder: Path) -> list[tuple[CauseGroup, Path]]:
    """The delta's regressions grouped by cause, each group's known deviation found, and each
    group's check ids written to ``folder/K.txt`` (K from 1, the largest group first)."""
    groups = group_by_cause(entry["head"] for entry in delta.regressions)
    if not groups:
        return []
    deviations = load_deviations(deviations_path("vllm"))
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


def _in_scope_because(path: str, scope: Scope | None) -> str:
    functions = scope.files.get(path, {}) if scope is not None else {}
    if not functions:
        return "the model's own"
    checks = set().union(*(f.checks for f in functions.values()))
    return f"{len(functions)} of its functions run by {len(checks)} checks"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _group_lines(k: int, group: CauseGroup, ids_file: Path, head: Side) -> list[str]:
    count = len(group.ids)
    lines = [
        f"### {k}. {count} check{'s' if count != 1 else ''}: `{group.type}` from `{group.frame}`",
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


def render(
    repo: Path,
    touched: list[str],
    base: Side,
    head: Side,
    delta: Delta,
    groups: list[tuple[CauseGroup, Path]],
    status: int,
    scope: Scope | None = None,
    notes: list[str] | None = None,
) -> str:
    verdict = {
        0: "no regression",
        1: f"{len(delta.regressions)} regression(s)",
        2: "a side could not run",
    }[status]
    lines = [
        f"# Gate: `{repo}` {base.rev} → {head.rev}",
        "",
        f"**{verdict}** (exit status {status}). Files touched that the checks run: "
        + ", ".join(f"`{p}` ({_in_scope_because(p, scope)})" for p in touched)
        + ".",
        "",
    ]
    for side in (base, head):
        problem = run_verdict(side.run).problem
        problem = f" — {problem}" if problem else ""
        how = "cached results" if side.cached else f"{side.seconds:g} s"
        lines.append(f"- {side.name} ({side.rev}): {side.status}{problem} ({how})")
    lines += [f"- {note}" for note in notes or []]
    lines += [
        "",
        f"## Regressions ({len(delta.regressions)}) in {len(groups)} group(s) by cause",
        "",
    ]
    for k, (group, ids_file) in enumerate(groups, start=1):
        lines += _group_lines(k, group, ids_file, head)
    deviation_file = deviations_path("vllm").relative_to(ROOT)
    lines += [
        f"## Fixed known deviations ({len(delta.fixed_deviations)}): delete their entries from "
        f"`{deviation_file}`",
        "",
    ]
    lines += [f"- `{entry['id']}`" for entry in delta.fixed_deviations]
    lines += ["", f"## Other fixes ({len(delta.fixes)})", ""]
    lines += [
        f"- `{entry['id']}`: {entry['base']} → {entry['head']['outcome']}" for entry in delta.fixes
    ]
    if delta.new or delta.removed:
        lines += [
            "",
            f"## New checks ({len(delta.new)}), removed checks ({len(delta.removed)})",
            "",
        ]
        lines += [f"- new: `{c}`" for c in delta.new] + [f"- removed: `{c}`" for c in delta.removed]
    unchanged = ", ".join(f"{n} {what}" for what, n in sorted(delta.unchanged.items()))
    lines += ["", f"Unchanged: {sum(delta.unchanged.values())} checks ({unchanged or 'none'}).", ""]
    return "\n".join(lines)
