"""The mutation score over vLLM's model code: ``nox -s mutation`` (outside CI).

A seeded sample of first-order mutants (:mod:`harness.mutation.ast_mutants`) of the functions the
suites claim to cover, each written as a ``vllm-file:`` copy (never an edit of the installed
package) and run against only the suites that cover its function, from one process
(:mod:`harness.mutation.runner`). A mutant is killed when its run fails a check, errors, crashes
or passes its time limit; a check that stops failing (a known deviation passing) kills it too,
since behaviour changed and the suites saw it.

Each survivor is then run again against the whole conformance suites as they are now
(``--recheck``): a check outside its concern's suites, or one added since, may kill it, and the
report names that check. A survivor left is classified in ``fixtures/mutation_survivors.toml``:
``equivalent`` (with the reason it cannot change behaviour) or ``gpu-only`` (with the reason only
a run on a GPU could show it); one not classified there is listed as such.

The score is killed / (run - equivalent), with a 95% Wilson interval for the sampling error.

    nemotron-vl-mutation-score [--sample 300] [--seed 0] [--parallel 2] [--fresh]
    nemotron-vl-mutation-score --recheck      # the survivors against every suite
    nemotron-vl-mutation-score --shard K/N    # every N-th sampled mutant from the K-th
    nemotron-vl-mutation-score --merge reports/mutation-runs-*-of-N.jsonl

A shard keeps its runs in ``reports/mutation-runs-K-of-N.jsonl`` (its first line names the
shard, the sample and the seed) and its report in ``reports/mutation-K-of-N.{md,json}``;
``--merge`` checks the N shards are one sweep and writes the report of the whole sample, the
same an unsharded run writes (the wall times summed).

Resumable: each finished mutant is appended to ``reports/mutation-runs.jsonl``; a later run skips
those (same sample and seed) unless ``--fresh``. Writes ``reports/mutation.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.results import replace_text
from harness.mutation.ast_mutants import COVERED, AstMutant, candidates, sample, write_mutant_file
from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_many
from harness.mutation.shards import (
    WHOLE,
    Shard,
    ShardError,
    add_shard_options,
    check_complete,
)

REPORT = ROOT / "reports" / "mutation"
RUNS_FILE = ROOT / "reports" / "mutation-runs.jsonl"
SURVIVORS_FILE = ROOT / "fixtures" / "mutation_survivors.toml"
DEFAULT_SAMPLE = 300
#: A mutant that loops or stalls is killed after this many seconds (its suites take at most
#: about two minutes on a 2-core machine unmutated).
RUN_TIMEOUT_S = 300.0
VERDICTS = ("equivalent", "gpu-only")
RECHECK_SUITES = ("suites/conformance",)


class SurvivorFileError(ValueError):
    """The survivor classification file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Classification:
    verdict: str  # one of VERDICTS
    reason: str  # why it cannot change behaviour, or why only a GPU run could show it


def load_survivors(path: Path = SURVIVORS_FILE) -> dict[str, Classification]:
    if not path.is_file():
        return {}
    document = tomllib.loads(path.read_text())
    out: dict[str, Classification] = {}
    for index, entry in enumerate(document.get("survivor", [])):
        where = f"{path.name}: survivor {index}"
        for key in ("id", "verdict", "reason"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise SurvivorFileError(f"{where}: field {key!r}: expected a non-empty string")
        if entry["verdict"] not in VERDICTS:
            raise SurvivorFileError(
                f"{where}: field 'verdict': expected one of {VERDICTS}, got {entry['verdict']!r}"
            )
        out[entry["id"]] = Classification(entry["verdict"], entry["reason"])
    return out


def wilson_interval(killed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``killed / total``."""
    if total == 0:
        return (0.0, 1.0)
    p = killed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _outcome(run: SuiteRun, failed: list[str]) -> str:
    if run.timed_out:
        return "killed (timeout)"
    if run.returncode not in (0, 5) or failed:
        return "killed"
    return "survived"


def _run_sample(
    mutants: list[AstMutant],
    done: dict[str, dict[str, Any]],
    parallel: int,
    workdir: Path,
    *,
    recheck: bool = False,
    runs_file: Path = RUNS_FILE,
) -> None:
    """Run each mutant not run yet against its covering suites; with ``recheck``, each survivor
    not rechecked yet against every conformance suite."""
    suites_of = {(c.file, c.qualname): c.suites for c in COVERED}
    jobs: list[SuiteJob] = []
    for mutant in mutants:
        if recheck:
            row = done.get(mutant.id)
            if row is None or row["status"] != "survived" or "recheck" in row:
                continue
            suites: tuple[str, ...] = RECHECK_SUITES
        elif mutant.id in done:
            continue
        else:
            suites = tuple(suites_of[mutant.file, mutant.qualname])
        folder = workdir / f"m{len(jobs):04d}"
        path = write_mutant_file(mutant, folder / "src")
        jobs.append(
            SuiteJob(
                mutant.id,
                f"vllm-file:{path}",
                suites,
                folder,
                extra_args=("-x",),  # the first failing check kills it
            )
        )
    if not jobs:
        return
    preload(vllm=True)
    for count, run in enumerate(run_many(jobs, parallel=parallel, timeout_s=RUN_TIMEOUT_S), 1):
        failed = [c["id"] for c in run.checks if c["outcome"] in ("fail", "error", "xpass")]
        row = {
            "id": run.key,
            "status": _outcome(run, failed),
            "exit": run.returncode,
            "killed_by": failed[:3],
            "reason": next(
                (c["reason"].splitlines()[0][:200] for c in run.checks if c["id"] in failed[:1]),
                "; ".join(run.problems),
            ),
            "wall_s": run.wall_s,
        }
        if recheck:
            row = {**done[run.key], "recheck": row}
        done[run.key] = row
        with runs_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        status = row["recheck"]["status"] if recheck else row["status"]
        print(f"[mutation] {count}/{len(jobs)} {status}: {run.key}", flush=True)


def _read_runs(path: Path = RUNS_FILE) -> tuple[dict[str, dict[str, Any]], float]:
    """The mutants run so far, by id, and the wall time of the sessions that ran them."""
    if not path.is_file():
        return {}, 0.0
    rows = _rows(path)
    sessions = sum(float(row["session_wall_s"]) for row in rows if "session_wall_s" in row)
    return {row["id"]: row for row in rows if "id" in row}, sessions


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shard_runs_file(shard: Shard) -> Path:
    """Where a shard's runs go unless told: beside the unsharded runs file."""
    if shard == WHOLE:
        return RUNS_FILE
    return RUNS_FILE.with_name(f"mutation-runs-{shard.index}-of-{shard.count}.jsonl")


def _sweep_of(path: Path) -> dict[str, Any]:
    """The ``{"shard", "sample", "seed"}`` line a shard's runs file starts with."""
    for row in _rows(path):
        if "shard" in row:
            return row
    raise ShardError(f"merge: {path}: no shard line; is it the runs file of a --shard run?")


def merge_runs(paths: list[Path]) -> tuple[dict[str, dict[str, Any]], float, int, int]:
    """The shards' runs files as one: the mutants run by id, the sessions' wall time, and the
    sample and seed the shards share. :class:`ShardError` names a shard missing, repeated or of
    another sweep, or a mutant in two shards."""
    sweeps = [_sweep_of(path) for path in paths]
    check_complete([str(s["shard"]) for s in sweeps], [str(p) for p in paths])
    for sweep, path in zip(sweeps, paths, strict=True):
        if (sweep["sample"], sweep["seed"]) != (sweeps[0]["sample"], sweeps[0]["seed"]):
            raise ShardError(
                f"merge: {path}: sample {sweep['sample']}, seed {sweep['seed']}; {paths[0]}: "
                f"sample {sweeps[0]['sample']}, seed {sweeps[0]['seed']}: not one sweep"
            )
    done: dict[str, dict[str, Any]] = {}
    wall = 0.0
    for path in paths:
        rows, sessions = _read_runs(path)
        for mutant_id, row in rows.items():
            if mutant_id in done:
                raise ShardError(f"merge: {path}: mutant {mutant_id} is in two shards")
            done[mutant_id] = row
        wall += sessions
    return done, wall, int(sweeps[0]["sample"]), int(sweeps[0]["seed"])


def build_report(
    mutants: list[AstMutant],
    done: dict[str, dict[str, Any]],
    *,
    total_candidates: int,
    seed: int,
    wall_s: float,
) -> dict[str, Any]:
    survivors = load_survivors()
    rows = []
    for mutant in mutants:
        row = dict(done.get(mutant.id, {"id": mutant.id, "status": "not run"}))
        row.update(
            file=str(mutant.file),
            function=mutant.qualname,
            line=mutant.line,
            operator=mutant.operator,
            description=mutant.description,
        )
        if row["status"] == "survived":
            known = survivors.get(mutant.id)
            recheck = row.get("recheck")
            if recheck is not None and recheck["status"].startswith("killed"):
                killer = (recheck["killed_by"] or ["its time limit"])[0]
                row["classification"] = {
                    "verdict": "killed on recheck",
                    "reason": f"{killer}: {recheck['reason']}",
                }
            elif known is not None:
                row["classification"] = {"verdict": known.verdict, "reason": known.reason}
            else:
                row["classification"] = {"verdict": "unclassified", "reason": ""}
        rows.append(row)
    run = [r for r in rows if r["status"] != "not run"]

    def verdicts(name: str) -> int:
        return sum(r.get("classification", {}).get("verdict") == name for r in run)

    killed = sum(r["status"].startswith("killed") for r in run)
    killed_later = verdicts("killed on recheck")
    equivalent = verdicts("equivalent")
    gpu_only = verdicts("gpu-only")
    unclassified = verdicts("unclassified")
    denominator = len(run) - equivalent
    score = (killed + killed_later) / denominator if denominator else 0.0
    low, high = wilson_interval(killed + killed_later, denominator)
    by_operator: Counter[str] = Counter()
    by_operator_killed: Counter[str] = Counter()
    for r in run:
        by_operator[r["operator"]] += 1
        by_operator_killed[r["operator"]] += r["status"].startswith("killed")
    return {
        "seed": seed,
        "candidates": total_candidates,
        "sampled": len(mutants),
        "run": len(run),
        "functions": [f"{c.file}:{c.qualname}" for c in COVERED],
        "killed_by_suites": killed,
        "killed_on_recheck": killed_later,
        "equivalent": equivalent,
        "gpu_only": gpu_only,
        "unclassified_survivors": unclassified,
        "score": round(score, 4),
        "interval_95": [round(low, 4), round(high, 4)],
        "wall_s": round(wall_s, 1),
        "by_operator": {
            op: {"run": n, "killed": by_operator_killed[op]}
            for op, n in sorted(by_operator.items())
        },
        "mutants": rows,
    }


def render_markdown(report: dict[str, Any]) -> str:
    low, high = report["interval_95"]
    lines = [
        "# Mutation score over vLLM's model code",
        "",
        f"{report['sampled']} first-order mutants sampled (seed {report['seed']}) from "
        f"{report['candidates']} candidates in {len(report['functions'])} functions the suites "
        f"claim to cover; {report['run']} run, wall time {report['wall_s']:.0f} s.",
        "",
        f"- killed by the suites: {report['killed_by_suites']}",
        f"- survivors killed on recheck against every suite (a check outside the function's "
        f"concern, or added since): {report['killed_on_recheck']}",
        f"- equivalent (cannot change behaviour): {report['equivalent']}",
        f"- only a GPU run could show (counted as survivors): {report['gpu_only']}",
        f"- survivors not classified: {report['unclassified_survivors']}",
        f"- **score: {report['score']:.1%}** of non-equivalent mutants killed "
        f"(95% interval {low:.1%} to {high:.1%})",
        "",
        "## By operator",
        "",
        "| operator | run | killed |",
        "|---|---|---|",
    ]
    for op, n in report["by_operator"].items():
        lines.append(f"| {op} | {n['run']} | {n['killed']} |")
    lines += ["", "## Survivors of the covering suites", ""]
    lines += ["| mutant | what | verdict | reason |", "|---|---|---|---|"]
    for row in report["mutants"]:
        if row["status"] == "survived":
            c = row["classification"]
            lines.append(
                f"| `{row['id']}` | {row['description']} | {c['verdict']} | {c['reason']} |"
            )
    lines += ["", "## Functions covered", ""]
    lines += [f"- `{name}`" for name in report["functions"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--fresh", action="store_true", help="forget earlier runs")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report")
    parser.add_argument(
        "--recheck", action="store_true", help="run the survivors against every suite"
    )
    add_shard_options(parser, "sampled mutant", "runs files", "RUNS_JSONL")
    parser.add_argument("--out", type=Path, help="report path without suffix")
    args = parser.parse_args(argv)
    if args.sample < 1 or args.parallel < 1:
        parser.error("--sample and --parallel: expected positive numbers")
    shard: Shard = args.shard
    everything = candidates()
    if args.merge:
        try:
            done, wall, sample_size, seed = merge_runs(list(args.merge))
        except (OSError, json.JSONDecodeError, ShardError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        mutants = sample(everything, sample_size, seed)
        out = args.out or REPORT
    else:
        seed = args.seed
        mutants = shard.select(sample(everything, args.sample, seed))
        runs_file = shard_runs_file(shard)
        out = args.out or (
            REPORT
            if shard == WHOLE
            else REPORT.with_name(f"mutation-{shard.index}-of-{shard.count}")
        )
        runs_file.parent.mkdir(parents=True, exist_ok=True)
        if args.fresh and runs_file.exists():
            runs_file.unlink()
        if shard != WHOLE and not runs_file.exists():
            sweep = {"shard": str(shard), "sample": args.sample, "seed": seed}
            runs_file.write_text(json.dumps(sweep) + "\n")
        done, wall = _read_runs(runs_file)
        if not args.report_only:
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="mutation-") as tmp, shared_folders():
                try:
                    _run_sample(
                        mutants,
                        done,
                        args.parallel,
                        Path(tmp),
                        recheck=args.recheck,
                        runs_file=runs_file,
                    )
                finally:  # an interrupted session counts too: its mutants are kept
                    session = time.perf_counter() - started
                    with runs_file.open("a") as f:
                        f.write(json.dumps({"session_wall_s": round(session, 1)}) + "\n")
                    wall += session
    try:
        report = build_report(
            mutants, done, total_candidates=len(everything), seed=seed, wall_s=wall
        )
    except SurvivorFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    replace_text(out.with_suffix(".md"), render_markdown(report))
    print(
        f"[mutation] score {report['score']:.1%} "
        f"(95% {report['interval_95'][0]:.1%}-{report['interval_95'][1]:.1%}), "
        f"{report['unclassified_survivors']} unclassified survivors"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
