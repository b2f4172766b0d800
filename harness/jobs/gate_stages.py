"""The gate's two stages: the checks that execute a change's functions first, then the rest.

A change's functions are those holding a changed line, on either side (``git diff -U0``: the
base's removed lines in the base's file, the head's added lines in the head's); the scope table
(:mod:`harness.jobs.scope`) names the checks that executed each. Stage one runs those checks on
both sides and gives its verdict; stage two runs every other check, and the delta compares the
two stages' results together. A changed line outside every function (an import, a constant, a
class attribute) may change anything a module does: then there is one stage, all checks. A local
run may stop after stage one (``--first-stage-only``); CI never does.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.jobs.gate_report import Side, compare
from harness.jobs.report import TargetRun
from harness.jobs.results import TargetStatus, merge_groups
from harness.jobs.scope import Scope, changed_functions, functions_of, innermost_function

#: A hunk header of ``git diff -U0``: the base's first line and count, the head's.
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


@dataclass(frozen=True)
class FirstStage:
    """The changed functions per file and the checks that executed any of them."""

    functions: dict[str, list[str]]
    ids: list[str]

    def write(self, folder: Path) -> Path:
        """The ids, one a line, in ``folder`` under a name from their content (the base side's
        cached results are keyed by the pytest arguments, this file's name among them)."""
        text = "".join(f"{check}\n" for check in self.ids)
        path = folder / f"stage-1-{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


def changed_lines(diff: str) -> tuple[list[int], list[int]]:
    """From ``git diff -U0`` of one file: the base's changed lines and the head's (a pure
    deletion marks the head's line it follows, a pure insertion the base's)."""
    base: list[int] = []
    head: list[int] = []
    for found in HUNK.finditer(diff):
        start, count = int(found[1]), int(found[2] if found[2] is not None else 1)
        base += list(range(start, start + count)) if count else [max(start, 1)]
        start, count = int(found[3]), int(found[4] if found[4] is not None else 1)
        head += list(range(start, start + count)) if count else [max(start, 1)]
    return base, head


def file_diff(repo: Path, base: str, head: str | None, path: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "diff", "-U0", base, *([head] if head else []), "--", path],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ValueError(f"git diff -U0 {base} {head or ''} -- {path}: {proc.stderr.strip()}")
    return proc.stdout


def first_stage(
    diffs: dict[str, str], sources: dict[str, tuple[str | None, str | None]], scope: Scope
) -> FirstStage | None:
    """The first stage of a change: ``diffs`` per touched file (``git diff -U0``), ``sources``
    the file's base and head text (None where the side lacks it). None when a changed line is
    outside every function of its side's file, or a file is added or deleted: one stage then."""
    functions: dict[str, list[str]] = {}
    for path, diff in diffs.items():
        base_source, head_source = sources[path]
        if base_source is None or head_source is None:
            return None
        base_lines, head_lines = changed_lines(diff)
        names: set[str] = set()
        for source, lines in ((base_source, base_lines), (head_source, head_lines)):
            spans = list(functions_of(source))
            if any(innermost_function(spans, line) is None for line in lines):
                return None  # module-level: anything the module does may change
            names |= changed_functions(source, lines)
        functions[path] = sorted(names)
    ids: set[str] = set()
    for path, changed in functions.items():
        ids.update(scope.checks_of(path, changed))
    return FirstStage(functions, [check for check in scope.checks if check in ids])


def selected_none(side: Side) -> bool:
    """Whether a side's run selected no check (its stage holds none of a ``-k`` selection)."""
    return side.run.results is not None and side.run.results["selected"] == 0


def merged_side(first: Side, second: Side) -> Side:
    """One side's two stages as one run: the checks of both, the worse status."""
    if first.run.results is None or second.run.results is None:
        return first if first.run.results is None else second
    results = merge_groups([first.run.results, second.run.results])
    run = TargetRun(first.run.selector, max(first.run.exit_status, second.run.exit_status), results)
    return Side(
        first.name,
        first.rev,
        first.files,
        run,
        round(first.seconds + second.seconds, 1),
        cached=first.cached and second.cached,
    )


def plan_stages(
    repo: Path, base: str, head: str | None, touched: list[str], out: Path, scope: Scope
) -> FirstStage | None:
    """The first stage of the change (:mod:`harness.jobs.gate_stages`), or None: one stage."""
    try:
        diffs = {path: file_diff(repo, base, head, path) for path in touched}
    except ValueError as e:
        print(f"gate: one stage: {e}", flush=True)
        return None

    def text(path: Path) -> str | None:
        return path.read_text() if path.is_file() else None

    sources = {
        path: (text(out / "base" / "src" / path), text(out / "head" / "src" / path))
        for path in touched
    }
    stage = first_stage(diffs, sources, scope)
    return stage if stage is not None and stage.ids else None


def stage_notes(stage: FirstStage | None) -> list[str]:
    if stage is None:
        return [
            "one stage: every check (a changed line outside every function, a file added "
            "or deleted, or no check executes the changed functions)"
        ]
    changed = "; ".join(f"{path}: {', '.join(names)}" for path, names in stage.functions.items())
    return [f"changed functions: {changed}"]


def staged_sides(
    both: Callable[..., tuple[Side, Side]],
    stage: FirstStage,
    notes: list[str],
    out: Path,
    first_stage_only: bool,
) -> tuple[Side, Side]:
    """The base and head sides over both stages: ``both(*pytest_args, stage_name=...)`` runs a
    selection on both sides; stage one's verdict is printed as soon as it is known, and each
    stage's note appended to ``notes``. ``first_stage_only``: stage two is not run."""
    listed = str(stage.write(out / "stages"))
    started = time.monotonic()
    base, head = both("--checks-from", listed, stage_name="1")
    first = compare(base.outcomes, head.outcomes)
    if selected_none(head):  # the caller's selection holds none of them
        notes.append(
            f"stage 1: the pytest arguments select none of the {len(stage.ids)} checks "
            "that executed them"
        )
    else:
        notes.append(
            f"stage 1: the {len(stage.ids)} checks that executed them, "
            f"{len(first.regressions)} regression(s) "
            f"({time.monotonic() - started:.0f} s; head {head.status}, base {base.status})"
        )
    print(f"gate: {notes[-1]}", flush=True)
    if first_stage_only:
        notes.append("stage 2 not run (--first-stage-only): a local verdict only")
    elif selected_none(head):
        base, head = both("--checks-not-from", listed, stage_name="2")
        notes.append(f"stage 2: every check (head {head.status}, base {base.status})")
    elif TargetStatus.COULD_NOT_RUN not in (head.status, base.status):
        rest_base, rest_head = both("--checks-not-from", listed, stage_name="2")
        if selected_none(rest_head):  # a pytest selection (-k) left nothing more
            notes.append("stage 2: no other check selected")
        else:
            base, head = merged_side(base, rest_base), merged_side(head, rest_head)
            notes.append(f"stage 2: every other check (head {head.status}, base {base.status})")
    return base, head
