"""The kill matrix: every corpus mutant against the conformance suites, ``nox -s mutants``.

For each mutant of the corpus (:mod:`harness.mutation.corpus`; vLLM's files with an upstream bug
put back, and the reference with one), the whole conformance suites run on it, and the matrix
records mutant x check: the checks that fail (killed it) with the first line of their reason,
whether the record's pinned checks are among them, and the mutant's wall time. The unmutated
``vllm`` and ``reference`` targets run first: the baseline must be green (no failure, no
unexpected pass), or a kill proves nothing.

    nemotron-vl-kill-matrix [--out reports/mutants] [--parallel N] [--only NAME ...]
                            [--shard K/N]
    nemotron-vl-kill-matrix --merge SHARD.json ... [--out reports/mutants]

``--shard K/N`` runs the baselines and every N-th mutant from the K-th
(:mod:`harness.mutation.shards`); ``--merge`` puts the N shards' files back together into the
matrix an unsharded run writes (the same rows and verdicts; the wall times summed).

Writes ``mutants.json`` and ``mutants.md``; exits 0 when the baseline is green and every corpus
mutant that can show on CPU is killed, 1 otherwise, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.results import replace_text
from harness.mutation.corpus import CorpusError, CorpusMutant, Record, load_corpus
from harness.mutation.file_mutants import MutationError, write_mutant
from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_many
from harness.mutation.shards import (
    WHOLE,
    Shard,
    ShardError,
    add_shard_options,
    check_complete,
)

SUITES = ("suites/conformance",)
DEFAULT_OUT = ROOT / "reports" / "mutants"
BASELINES = ("vllm", "reference")


def first_line(reason: str, width: int = 160) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


@dataclass
class MutantVerdict:
    """One mutant's row of the matrix."""

    mutant: CorpusMutant
    run: SuiteRun | None
    error: str | None = None  # why it could not run (its pattern is gone)

    @property
    def failed(self) -> dict[str, str]:
        if self.run is None:
            return {}
        return {c["id"]: c["reason"] for c in self.run.checks if c["outcome"] in ("fail", "error")}

    @property
    def killed(self) -> bool:
        return self.run is not None and (bool(self.failed) or self.run.returncode not in (0, 5))

    @property
    def pinned_missing(self) -> list[str]:
        return sorted(set(self.mutant.fails) - set(self.failed))

    def as_dict(self) -> dict[str, Any]:
        return {
            "record": self.mutant.record,
            "kind": self.mutant.kind,
            "name": self.mutant.name,
            "status": "could not run" if self.error else "killed" if self.killed else "survived",
            "error": self.error,
            "wall_s": None if self.run is None else self.run.wall_s,
            "exit": None if self.run is None else self.run.returncode,
            "killed_by": {check: first_line(r) for check, r in sorted(self.failed.items())},
            "pinned_missing": self.pinned_missing,
            "problems": [] if self.run is None else self.run.problems,
        }


def _job(mutant: CorpusMutant, workdir: Path, suites: Sequence[str]) -> SuiteJob:
    if mutant.kind == "vllm-file":
        target = f"vllm-file:{write_mutant(mutant.name, workdir / 'src')}"
    else:
        target = f"reference-mutant:{mutant.name}"
    return SuiteJob(mutant.key, target, tuple(suites), workdir)


def run_matrix(
    records: Sequence[Record],
    workdir: Path,
    *,
    suites: Sequence[str] = SUITES,
    parallel: int = 2,
    only: Sequence[str] = (),
    shard: Shard = WHOLE,
) -> dict[str, Any]:
    """Run the baselines and every selected mutant of ``shard``; the matrix as a JSON-ready
    dict."""
    started = time.perf_counter()
    mutants = shard.select([m for r in records for m in r.mutants if not only or m.name in only])
    verdicts: dict[str, MutantVerdict] = {}
    jobs = [SuiteJob(f"baseline:{b}", b, tuple(suites), workdir / b) for b in BASELINES]
    for mutant in mutants:
        try:
            jobs.append(_job(mutant, workdir / mutant.key.replace(":", "-"), suites))
        except MutationError as e:
            verdicts[mutant.key] = MutantVerdict(mutant, None, str(e))
    preload(vllm=True)
    by_key = {m.key: m for m in mutants}
    baselines: dict[str, SuiteRun] = {}
    for run in run_many(jobs, parallel=parallel):
        print(f"[mutants] {run.key}: exit {run.returncode} in {run.wall_s:.0f} s", flush=True)
        if run.key.startswith("baseline:"):
            baselines[run.key.removeprefix("baseline:")] = run
        else:
            verdicts[run.key] = MutantVerdict(by_key[run.key], run)
    return matrix_document(
        records,
        [verdicts[m.key].as_dict() for m in mutants],
        {name: _baseline(run) for name, run in baselines.items()},
        suites=suites,
        wall_s=time.perf_counter() - started,
        parallel=parallel,
        shard=shard,
    )


def matrix_document(
    records: Sequence[Record],
    rows: list[dict[str, Any]],
    baseline: dict[str, dict[str, Any]],
    *,
    suites: Sequence[str],
    wall_s: float,
    parallel: int,
    shard: Shard,
) -> dict[str, Any]:
    """The matrix of ``rows`` (mutants' verdicts, in corpus order) and the ``baseline``."""
    gpu_only = {r.id: r.gpu_only for r in records if r.gpu_only}
    cpu_rows = [row for row in rows if row["record"] not in gpu_only]
    return {
        "suites": list(suites),
        "shard": str(shard),
        "wall_s": round(wall_s, 1),
        "parallel": parallel,
        "baseline": baseline,
        "records": [
            {
                "id": r.id,
                "upstream": list(r.upstream),
                "class": r.bug_class,
                "what": r.what,
                "files": list(r.files),
                "gpu_only": r.gpu_only,
                "mutants": [m.key for m in r.mutants],
            }
            for r in records
        ],
        "mutants": rows,
        "summary": {
            "records": len(records),
            "mutants": len(rows),
            "killed": sum(row["status"] == "killed" for row in rows),
            "cpu_mutants": len(cpu_rows),
            "cpu_killed": sum(row["status"] == "killed" for row in cpu_rows),
            "gpu_only": gpu_only,
        },
    }


#: What differs between two runs of the same matrix on the same code: how long it took.
WALL_FIELDS = ("wall_s", "parallel", "shard")


def merge_matrices(
    parts: Sequence[dict[str, Any]], names: Sequence[str], records: Sequence[Record]
) -> dict[str, Any]:
    """The shards ``parts`` (read from files ``names``) as the one matrix an unsharded run
    writes: every shard of one sweep once, on the same suites and corpus, with baselines that
    agree; rows in corpus order, wall times summed. :class:`ShardError` names what does not
    fit."""
    check_complete([str(p.get("shard", "1/1")) for p in parts], names)
    first = parts[0]
    for part, name in zip(parts, names, strict=True):
        for field in ("suites", "records"):
            if part[field] != first[field]:
                raise ShardError(
                    f"merge: {name}: {field} differ from {names[0]}'s: not shards of one sweep"
                )
        for target, base in part["baseline"].items():
            ours, theirs = _without_wall(base), _without_wall(first["baseline"].get(target, {}))
            if ours != theirs:
                raise ShardError(
                    f"merge: {name}: the {target} baseline ({ours}) differs from {names[0]}'s "
                    f"({theirs}): the shards ran different code"
                )
    order = [m.key for r in records for m in r.mutants]
    rows: dict[str, dict[str, Any]] = {}
    for part, name in zip(parts, names, strict=True):
        for row in part["mutants"]:
            key = f"{row['kind']}:{row['name']}"
            if key in rows:
                raise ShardError(f"merge: {name}: mutant {key} is in two shards")
            rows[key] = row
    baseline = {
        target: {**base, "wall_s": max(p["baseline"][target]["wall_s"] for p in parts)}
        for target, base in first["baseline"].items()
    }
    return matrix_document(
        records,
        [rows[key] for key in order if key in rows],
        baseline,
        suites=first["suites"],
        wall_s=sum(float(p["wall_s"]) for p in parts),
        parallel=int(first["parallel"]),
        shard=WHOLE,
    )


def _without_wall(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in WALL_FIELDS}


def _baseline(run: SuiteRun) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for check in run.checks:
        counts[check["outcome"]] = counts.get(check["outcome"], 0) + 1
    green = run.returncode == 0 and not run.outcomes("fail") and not run.outcomes("xpass")
    return {"exit": run.returncode, "green": green, "counts": counts, "wall_s": run.wall_s}


def green(matrix: dict[str, Any]) -> bool:
    summary = matrix["summary"]
    return (
        all(b["green"] for b in matrix["baseline"].values())
        and summary["cpu_killed"] == summary["cpu_mutants"]
    )


def render_markdown(matrix: dict[str, Any]) -> str:
    s = matrix["summary"]
    lines = [
        "# Kill matrix: the regression corpus against the conformance suites",
        "",
        f"Suites: {', '.join(matrix['suites'])}. {s['records']} records, {s['mutants']} mutants; "
        f"killed {s['killed']} of {s['mutants']} ({s['cpu_killed']} of {s['cpu_mutants']} that "
        f"can show on CPU). Wall time {matrix['wall_s']:.0f} s, {matrix['parallel']} at a time"
        + (
            f"; shard {matrix['shard']} of the corpus."
            if matrix.get("shard", "1/1") != "1/1"
            else "."
        ),
        "",
        "## Baseline (unmutated targets)",
        "",
        "| target | green | outcomes | wall s |",
        "|---|---|---|---|",
    ]
    for name, b in matrix["baseline"].items():
        counts = ", ".join(f"{k} {v}" for k, v in sorted(b["counts"].items()))
        lines.append(f"| {name} | {'yes' if b['green'] else 'NO'} | {counts} | {b['wall_s']:.0f} |")
    if s["gpu_only"]:
        lines += ["", "## GPU-only classes", ""]
        lines += [f"- `{rid}`: {why}" for rid, why in sorted(s["gpu_only"].items())]
    lines += [
        "",
        "## Mutants",
        "",
        "| record | upstream | mutant | status | checks failed | pinned all failed | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    upstream = {r["id"]: ", ".join(r["upstream"]) for r in matrix["records"]}
    for row in matrix["mutants"]:
        wall = "" if row["wall_s"] is None else f"{row['wall_s']:.0f}"
        pinned = "yes" if not row["pinned_missing"] else f"no ({len(row['pinned_missing'])})"
        lines.append(
            f"| {row['record']} | {upstream[row['record']]} | `{row['kind']}:{row['name']}` | "
            f"{row['status']} | {len(row['killed_by'])} | {pinned} | {wall} |"
        )
    lines += ["", "## Mutant x check", ""]
    for row in matrix["mutants"]:
        lines.append(f"### `{row['kind']}:{row['name']}` ({row['status']})")
        lines.append("")
        if row["error"]:
            lines.append(f"Could not run: {row['error']}")
        for problem in row["problems"]:
            lines.append(f"- run: {problem}")
        for check, reason in row["killed_by"].items():
            lines.append(f"- `{check}`: {reason}")
        for check in row["pinned_missing"]:
            lines.append(f"- pinned but passed: `{check}`")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports/mutants")
    parser.add_argument(
        "--parallel", type=int, default=min(2, os.cpu_count() or 1), help="children at a time"
    )
    parser.add_argument("--only", nargs="*", default=[], help="mutant names to run")
    parser.add_argument("--suites", nargs="*", default=list(SUITES), help="suites to run")
    add_shard_options(parser, "mutant", "mutants.json (into --out)", "SHARD_JSON")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel: expected a positive number, got {args.parallel}")
    shard: Shard = args.shard
    try:
        records = load_corpus()
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.merge:
        try:
            parts = [json.loads(path.read_text()) for path in args.merge]
            matrix = merge_matrices(parts, [str(p) for p in args.merge], records)
        except (OSError, json.JSONDecodeError, KeyError, ShardError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        with tempfile.TemporaryDirectory(prefix="mutants-") as tmp, shared_folders():
            matrix = run_matrix(
                records,
                Path(tmp),
                suites=args.suites,
                parallel=args.parallel,
                only=args.only,
                shard=shard,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    replace_text(args.out.with_suffix(".json"), json.dumps(matrix, indent=2) + "\n")
    replace_text(args.out.with_suffix(".md"), render_markdown(matrix))
    print(f"[mutants] wrote {args.out.with_suffix('.md')} and .json")
    return 0 if green(matrix) else 1


if __name__ == "__main__":
    raise SystemExit(main())
