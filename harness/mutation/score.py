"""The mutation score over vLLM's model code: ``nox -s mutation`` (outside CI).

The scope is measured, not listed: every function of the model family's files
(:mod:`harness.mutation.reach`), with the checks that execute each line found by running the suites
under coverage.py (the reach map, measured again when vLLM, the suites or the harness change). A
seeded sample of first-order mutants (:mod:`harness.mutation.ast_mutants`), stratified so that every
function in scope has at least one, is written as ``vllm-file:`` copies (never an edit of the
installed package); each runs against only the checks that execute its line, those that killed its
neighbours in the last sweep first (:mod:`harness.mutation.history`), from one process
(:mod:`harness.mutation.runner`), under a time limit derived from those checks' measured times. A
mutant on a line no check executes is a survivor without a run ("unreached"). A mutant is killed
when its run fails a check, errors, crashes or passes its time limit; a check that stops failing (a
known deviation passing) kills it too, since behaviour changed and the suites saw it.

Each survivor is then run again against the whole conformance suites as they are now
(``--recheck``): a check outside its concern's suites, or one added since, may kill it, and the
report names that check. A survivor left is classified in ``fixtures/mutation_survivors.toml``:
``equivalent`` (with the reason it cannot change behaviour) or ``gpu-only`` (with the reason only
a run on a GPU could show it); one not classified there is listed as such. An entry records the
vLLM it was classified against (``classified_against``: vLLM's version and a digest of the scope
files, :func:`classified_against`); while those are what is installed, the mutant is not run
again (its verdict is a fact about that code, and its checks are the sweep's costliest: a
survivor runs every check that reaches its line, up to all of them), and the report counts it
apart. Against other files, it runs like any mutant.

The score is killed / (sampled - equivalent), unreached mutants counted as survivors, with a 95%
Wilson interval for the sampling error. The report lists the functions and lines no check
reaches.

    nemotron-vl-mutation-score [--sample 600] [--seed 0] [--parallel 2] [--fresh] [--remeasure]
                               [--history reports/mutation.json | --no-history]
    nemotron-vl-mutation-score --recheck      # the survivors against every suite
    nemotron-vl-mutation-score --shard K/N    # every N-th sampled mutant from the K-th
    nemotron-vl-mutation-score --merge reports/mutation-runs-*-of-N.jsonl
    nemotron-vl-mutation-score --fresh --from-report reports/mutation.json  # after a new map

A shard keeps its runs in ``reports/mutation-runs-K-of-N.jsonl`` (its first line names the shard,
the sample, the seed, the reach map's fingerprint and the kill history's digest, which every shard
must share) and its report in ``reports/mutation-K-of-N.{md,json}``; ``--merge`` checks the N shards
are one sweep and writes the report of the whole sample, the same an unsharded run writes (the wall
times summed).

After the reach map changes (a check added, or the map measured another way), ``--from-report``
goes on from the committed report instead of sampling anew: its results are kept, and only the
mutants it recorded unreached that the map now reaches, and the survivors the map now gives more
checks, are run.

Resumable: each finished mutant is appended to ``reports/mutation-runs.jsonl``; a later run skips
those (same sample and seed) unless ``--fresh``. Writes ``reports/mutation.{md,json}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.results import replace_text
from harness.model_files import installed_file
from harness.mutation.ast_mutants import AstMutant, candidates, sample, write_mutant_file
from harness.mutation.history import HistoryError, KillHistory
from harness.mutation.reach import (
    REACH_FILE,
    SCOPE,
    Reach,
    ReachError,
    current_reach,
    functions_in_scope,
    read_reach,
    scope_summary,
    summary_lines,
)
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
DEFAULT_SAMPLE = 600
#: A mutant's time limit: this many times its checks' measured time (under coverage, itself
#: slower than a plain run), plus the set-up of a fresh process (its model builds). A mutant
#: that loops or stalls costs that, not the suites' time. No fixed cap: a run past its limit
#: counts as killed, so the limit must stay above an honest run of its checks on any machine
#: (a cap of 300 s was below that for survivors of 120 checks on a slow one).
RUN_LIMIT_FACTOR = 3.0
RUN_LIMIT_BASE_S = 60.0
VERDICTS = ("equivalent", "gpu-only")
RECHECK_SUITES = ("suites/conformance",)


class SurvivorFileError(ValueError):
    """The survivor classification file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Classification:
    verdict: str  # one of VERDICTS
    reason: str  # why it cannot change behaviour, or why only a GPU run could show it
    #: the vLLM it was classified against (:func:`classified_against`); "" when not recorded
    against: str = ""


def classified_against() -> str:
    """The installed vLLM's version and a digest of the scope files, as a survivor's
    ``classified_against`` records them."""
    digest = hashlib.sha256()
    for entry in SCOPE:
        digest.update(entry.file.as_posix().encode())
        digest.update(installed_file(entry.file).read_bytes())
    return f"vllm {metadata.version('vllm')}, scope files {digest.hexdigest()[:12]}"


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
        against = entry.get("classified_against", "")
        if not isinstance(against, str):
            raise SurvivorFileError(
                f"{where}: field 'classified_against': expected a string such as "
                f"'vllm 0.33.0, scope files 0123456789ab', got {against!r}"
            )
        out[entry["id"]] = Classification(entry["verdict"], entry["reason"], against)
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


def run_limit(reach: Reach, checks: list[str]) -> float:
    """The time limit of a mutant's run of ``checks`` (:data:`RUN_LIMIT_FACTOR`)."""
    return RUN_LIMIT_BASE_S + RUN_LIMIT_FACTOR * reach.seconds_of(checks)


def checks_of(reach: Reach, mutant: AstMutant, history: KillHistory | None = None) -> list[str]:
    """The checks that execute the mutant's line or its statement's, the quickest first, or in
    ``history``'s order (those that killed its neighbours first)."""
    checks = reach.checks_at(mutant.file, mutant.line, mutant.statement_line)
    return checks if history is None else history.order(mutant, checks)


def _classified_unchanged(classified: dict[str, Classification]) -> dict[str, Classification]:
    """The survivors classified against the installed vLLM and scope files: not run again."""
    if not classified:
        return {}
    now = classified_against()
    return {key: c for key, c in classified.items() if c.against == now}


def _classified_row(mutant: AstMutant, known: Classification, checks: int) -> dict[str, Any]:
    return {
        "id": mutant.id,
        "status": "survived",
        "classified_unchanged": True,
        "exit": None,
        "killed_by": [],
        "reason": f"classified {known.verdict} against {known.against}, which is installed: "
        "not run again",
        "checks": checks,
        "wall_s": 0.0,
    }


def _unreached_row(mutant: AstMutant) -> dict[str, Any]:
    return {
        "id": mutant.id,
        "status": "survived",
        "unreached": True,
        "exit": None,
        "killed_by": [],
        "reason": f"no check executes line {mutant.line}",
        "wall_s": 0.0,
    }


def _run_sample(
    mutants: list[AstMutant],
    done: dict[str, dict[str, Any]],
    parallel: int,
    workdir: Path,
    reach: Reach,
    *,
    recheck: bool = False,
    runs_file: Path = RUNS_FILE,
    history: KillHistory | None = None,
    classified: dict[str, Classification] | None = None,
) -> None:
    """Run each mutant not run yet against the checks that execute its line (one no check
    executes is recorded as an unreached survivor, one ``classified`` against the installed
    files as a survivor not run again); with ``recheck``, each reached survivor not rechecked
    yet against every conformance suite."""
    unchanged = _classified_unchanged(classified or {})
    jobs: list[SuiteJob] = []
    for mutant in mutants:
        if recheck:
            row = done.get(mutant.id)
            if row is None or row["status"] != "survived" or "recheck" in row:
                continue
            if row.get("unreached") or row.get("classified_unchanged"):
                continue  # no check executes its line, or its verdict is of these files
            suites: tuple[str, ...] = RECHECK_SUITES
            limit = run_limit(reach, reach.checks)  # every check of the map
        elif mutant.id in done:
            continue
        else:
            checks = checks_of(reach, mutant, history)
            if not checks or mutant.id in unchanged:
                done[mutant.id] = (
                    _classified_row(mutant, unchanged[mutant.id], len(checks))
                    if checks
                    else _unreached_row(mutant)
                )
                with runs_file.open("a") as f:
                    f.write(json.dumps(done[mutant.id]) + "\n")
                continue
            suites, limit = tuple(checks), run_limit(reach, checks)
        folder = workdir / f"m{len(jobs):04d}"
        path = write_mutant_file(mutant, folder / "src")
        jobs.append(
            SuiteJob(
                mutant.id,
                f"vllm-file:{path}",
                suites,
                folder,
                extra_args=("-x",),  # the first failing check kills it
                timeout_s=limit,
            )
        )
    if not jobs:
        return
    preload(vllm=True)
    suites_by_key = {job.key: job.suites for job in jobs}
    for count, run in enumerate(run_many(jobs, parallel=parallel), 1):
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
            "checks": len(suites_by_key[run.key]),
            "wall_s": run.wall_s,
        }
        if recheck:
            row = {**done[run.key], "recheck": row}
        done[run.key] = row
        with runs_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        status = row["recheck"]["status"] if recheck else row["status"]
        print(f"[mutation] {count}/{len(jobs)} {status}: {run.key}", flush=True)


#: What a runs file row holds (a report's row adds where the mutant is and its classification).
RUN_FIELDS = (
    "id",
    "status",
    "unreached",
    "classified_unchanged",
    "exit",
    "killed_by",
    "reason",
    "checks",
    "wall_s",
)


def runs_from_report(
    report: dict[str, Any], mutants: list[AstMutant], reach: Reach, *, sample_size: int, seed: int
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """An earlier report's runs to go on from (``--from-report``): a killed mutant keeps its
    result; a survivor keeps its (and its recheck) unless ``reach`` now gives its line more
    checks than it ran against; one recorded unreached is kept only while no check of ``reach``
    executes its line. Those not kept are left out, to run now. Returns the runs by id and the
    ids left out. :class:`ValueError` names a report of another sample or seed, or one
    whose mutants are not this sample's."""
    for field, want in (("seed", seed), ("sampled", sample_size)):
        if report.get(field) != want:
            raise ValueError(
                f"--from-report: the report's {field} is {report.get(field)!r}, expected {want}"
                " (give the same --sample and --seed)"
            )
    by_id = {mutant.id: mutant for mutant in mutants}
    runs: dict[str, dict[str, Any]] = {}
    again: list[str] = []
    for row in report.get("mutants", []):
        mutant = by_id.get(row.get("id", ""))
        if mutant is None:
            raise ValueError(
                f"--from-report: mutant {row.get('id')!r} is not in this sample: the report "
                "was drawn from other candidates (another vLLM or mutator)"
            )
        if row.get("status") == "not run":
            continue
        now = len(checks_of(reach, mutant))
        if row.get("unreached") and now:
            again.append(mutant.id)
            continue
        if row.get("status") == "survived" and not row.get("unreached") and now > row["checks"]:
            again.append(mutant.id)  # checks it did not run against may kill it
            continue
        runs[mutant.id] = {
            **{k: row[k] for k in RUN_FIELDS if k in row},
            **({"recheck": row["recheck"]} if "recheck" in row else {}),
        }
    return runs, again


def _read_runs(path: Path = RUNS_FILE) -> tuple[dict[str, dict[str, Any]], float]:
    """The mutants run so far, by id, and the wall time of the sessions that ran them."""
    if not path.is_file():
        return {}, 0.0
    rows = _rows(path)
    sessions = sum(float(row["session_wall_s"]) for row in rows if "session_wall_s" in row)
    return {row["id"]: row for row in rows if "id" in row}, sessions


def _read_history(path: Path) -> KillHistory | None:
    """The kill history a runs file's sweep began with, if it has begun."""
    if not path.is_file():
        return None
    for row in _rows(path):
        if "history" in row and isinstance(row["history"], dict):
            return KillHistory.from_json(row["history"], f"{path}")
    return None


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


@dataclass(frozen=True)
class Merged:
    """The shards' runs files as one."""

    done: dict[str, dict[str, Any]]  # the mutants run, by id
    wall_s: float  # the shards' sessions, summed
    sample: int
    seed: int
    reach: str | None  # the reach map's fingerprint the shards share
    history: str = ""  # the kill history's digest the shards share ("": none)


def merge_runs(paths: list[Path]) -> Merged:
    """The shards' runs files as one. :class:`ShardError` names a shard missing, repeated or of
    another sweep (another sample, seed or reach map), or a mutant in two shards."""
    sweeps = [_sweep_of(path) for path in paths]
    check_complete([str(s["shard"]) for s in sweeps], [str(p) for p in paths])
    for sweep, path in zip(sweeps, paths, strict=True):
        first = sweeps[0]
        if (sweep["sample"], sweep["seed"]) != (first["sample"], first["seed"]):
            raise ShardError(
                f"merge: {path}: sample {sweep['sample']}, seed {sweep['seed']}; {paths[0]}: "
                f"sample {first['sample']}, seed {first['seed']}: not one sweep"
            )
        if sweep.get("reach") != first.get("reach"):
            raise ShardError(
                f"merge: {path}: reach map {sweep.get('reach')}; {paths[0]}: reach map "
                f"{first.get('reach')}: the shards measured different scopes, not one sweep"
            )
        if sweep.get("history", "") != first.get("history", ""):
            raise ShardError(
                f"merge: {path}: kill history {sweep.get('history') or 'none'}; {paths[0]}: "
                f"kill history {first.get('history') or 'none'}: the shards ordered their "
                "checks by different histories, not one sweep"
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
    reach = sweeps[0].get("reach")
    return Merged(
        done,
        wall,
        int(sweeps[0]["sample"]),
        int(sweeps[0]["seed"]),
        None if reach is None else str(reach),
        str(sweeps[0].get("history", "")),
    )


def build_report(
    mutants: list[AstMutant],
    done: dict[str, dict[str, Any]],
    *,
    total_candidates: int,
    seed: int,
    wall_s: float,
    scope: dict[str, Any],
    history: str = "",
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
            if row.get("unreached"):
                row["classification"] = {"verdict": "unreached", "reason": row["reason"]}
            elif recheck is not None and recheck["status"].startswith("killed"):
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
    done_rows = [r for r in rows if r["status"] != "not run"]
    executed = [
        r for r in done_rows if not r.get("unreached") and not r.get("classified_unchanged")
    ]

    def verdicts(name: str) -> int:
        return sum(r.get("classification", {}).get("verdict") == name for r in done_rows)

    killed = sum(r["status"].startswith("killed") for r in done_rows)
    killed_later = verdicts("killed on recheck")
    equivalent = verdicts("equivalent")
    denominator = len(done_rows) - equivalent
    score = (killed + killed_later) / denominator if denominator else 0.0
    low, high = wilson_interval(killed + killed_later, denominator)
    by_operator: Counter[str] = Counter()
    by_operator_killed: Counter[str] = Counter()
    for r in done_rows:
        by_operator[r["operator"]] += 1
        by_operator_killed[r["operator"]] += r["status"].startswith("killed")
    run_wall = sum(float(r["wall_s"]) for r in executed)
    return {
        "seed": seed,
        "candidates": total_candidates,
        "sampled": len(mutants),
        "done": len(done_rows),
        "run": len(executed),
        "classified_not_run": sum(bool(r.get("classified_unchanged")) for r in done_rows),
        "scope": scope,
        "killed_by_suites": killed,
        "killed_on_recheck": killed_later,
        "equivalent": equivalent,
        "gpu_only": verdicts("gpu-only"),
        "unreached": verdicts("unreached"),
        "unclassified_survivors": verdicts("unclassified"),
        "score": round(score, 4),
        "interval_95": [round(low, 4), round(high, 4)],
        "wall_s": round(wall_s, 1),
        "history": history,
        "mean_run_wall_s": round(run_wall / len(executed), 2) if executed else 0.0,
        "mean_checks_per_run": (
            round(sum(int(r.get("checks", 0)) for r in executed) / len(executed), 1)
            if executed
            else 0.0
        ),
        "by_operator": {
            op: {"run": n, "killed": by_operator_killed[op]}
            for op, n in sorted(by_operator.items())
        },
        "mutants": rows,
    }


def render_markdown(report: dict[str, Any]) -> str:
    low, high = report["interval_95"]
    scope = report["scope"]
    lines = [
        "# Mutation score over vLLM's model code",
        "",
        f"{report['sampled']} first-order mutants sampled (seed {report['seed']}), stratified "
        f"over the {scope['functions']} functions in scope, from {report['candidates']} "
        f"candidates; {report['done']} done: {report['run']} run against the checks that "
        f"execute their line (on average {report['mean_checks_per_run']:g} checks, "
        f"{report['mean_run_wall_s']:g} s each run), {report['unreached']} on lines no check "
        f"executes. Wall time {report['wall_s']:.0f} s. "
        + (
            f"Each run's checks ran those that killed its neighbours in the sweep before first "
            f"(kill history `{report['history']}`), then the quickest."
            if report.get("history")
            else "Each run's checks ran the quickest first."
        ),
        "",
        f"- killed by the checks that execute their line: {report['killed_by_suites']}",
        f"- survivors killed on recheck against every suite (a check the reach map missed, or "
        f"added since): {report['killed_on_recheck']}",
        f"- equivalent (cannot change behaviour): {report['equivalent']}",
        f"- only a GPU run could show (counted as survivors): {report['gpu_only']}",
        f"- on a line no check executes (counted as survivors): {report['unreached']}",
        f"- survivors classified against the installed vLLM files, not run again (counted by "
        f"their verdict): {report.get('classified_not_run', 0)}",
        f"- survivors not classified: {report['unclassified_survivors']}",
        f"- **score: {report['score']:.1%}** of non-equivalent mutants killed "
        f"(95% interval {low:.1%} to {high:.1%})",
        "",
        "## By operator",
        "",
        "| operator | done | killed |",
        "|---|---|---|",
    ]
    for op, n in report["by_operator"].items():
        lines.append(f"| {op} | {n['run']} | {n['killed']} |")
    lines += ["", "## Survivors a check reaches", ""]
    lines += ["| mutant | what | verdict | reason |", "|---|---|---|---|"]
    for row in report["mutants"]:
        if row["status"] == "survived" and not row.get("unreached"):
            c = row["classification"]
            lines.append(
                f"| `{row['id']}` | {row['description']} | {c['verdict']} | {c['reason']} |"
            )
    lines += ["", "## Scope", ""]
    lines += [
        f"Every function of {', '.join(f'`{f}`' for f in scope['files'])} "
        "(NemotronH's forward, logits, embedding lookup and expert balancing excluded: the "
        "engine's forward pass, which no CPU check drives). What each check executes was "
        f"measured by running the {scope['checks']} conformance checks against the installed "
        f"vLLM under coverage.py ({scope['reach_wall_s']:.0f} s; reach map "
        f"`{scope['reach_fingerprint'][:12]}`).",
        "",
    ]
    lines += summary_lines(scope)
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
    parser.add_argument(
        "--reach",
        type=Path,
        default=REACH_FILE,
        metavar="JSON",
        help="the reach map (default: %(default)s; measured when missing or stale, except with "
        "--merge and --report-only, which read it as it is)",
    )
    parser.add_argument(
        "--remeasure", action="store_true", help="measure the reach map even when it is current"
    )
    history_options = parser.add_mutually_exclusive_group()
    history_options.add_argument(
        "--history",
        type=Path,
        default=REPORT.with_suffix(".json"),
        metavar="JSON",
        help="the mutation report whose kills order each mutant's checks, those that killed its "
        "neighbours first (default: %(default)s, read once before the first run; none there: "
        "the quickest first)",
    )
    history_options.add_argument(
        "--no-history", action="store_true", help="run each mutant's checks the quickest first"
    )
    # A resumed sweep keeps the history its runs file began with (--fresh starts another).
    parser.add_argument(
        "--from-report",
        type=Path,
        metavar="JSON",
        help="go on from an earlier report of the same sample and seed (its runs file gone): its "
        "mutants' results are kept, except the unreached ones the current reach map reaches "
        "and the survivors it gives more checks, which run now",
    )
    args = parser.parse_args(argv)
    if args.sample < 1 or args.parallel < 1:
        parser.error("--sample and --parallel: expected positive numbers")
    shard: Shard = args.shard
    everything = candidates()
    try:
        reach = (
            read_reach(args.reach)
            if args.merge or args.report_only
            else current_reach(args.reach, remeasure=args.remeasure)
        )
    except ReachError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.merge:
        try:
            merged = merge_runs(list(args.merge))
        except (OSError, json.JSONDecodeError, ShardError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if merged.reach is not None and merged.reach != reach.fingerprint:
            print(
                f"error: merge: the shards ran on reach map {merged.reach}; {args.reach} is "
                f"{reach.fingerprint}: give --reach the map the shards used",
                file=sys.stderr,
            )
            return 2
        done, wall, seed = merged.done, merged.wall_s, merged.seed
        history_digest = merged.history
        mutants = sample(everything, merged.sample, seed)
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
        try:
            # A sweep orders by the history it began with: a resumed one, by the runs file's.
            begun = _read_history(runs_file)
            history = begun or (
                KillHistory() if args.no_history else KillHistory.read(args.history)
            )
        except (OSError, json.JSONDecodeError, HistoryError) as e:
            print(f"error: --history: {e}", file=sys.stderr)
            return 2
        if shard != WHOLE and not runs_file.exists():
            sweep = {
                "shard": str(shard),
                "sample": args.sample,
                "seed": seed,
                "reach": reach.fingerprint,
                "history": history.digest,
            }
            runs_file.write_text(json.dumps(sweep) + "\n")
        if begun is None and not args.report_only:
            with runs_file.open("a") as f:
                f.write(json.dumps({"history": history.to_json()}) + "\n")
        done, wall = _read_runs(runs_file)
        history_digest = history.digest
        if args.from_report is not None:
            if shard != WHOLE:
                print("error: --from-report: not with --shard (go on unsharded)", file=sys.stderr)
                return 2
            if done:
                print(
                    f"error: --from-report: {runs_file} already holds runs; add --fresh to "
                    "start from the report instead",
                    file=sys.stderr,
                )
                return 2
            try:
                previous = json.loads(args.from_report.read_text())
                done, again = runs_from_report(
                    previous, mutants, reach, sample_size=args.sample, seed=seed
                )
            except (OSError, json.JSONDecodeError, ValueError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            wall = float(previous.get("wall_s", 0.0))
            with runs_file.open("a") as f:
                for row in done.values():
                    f.write(json.dumps(row) + "\n")
                f.write(json.dumps({"session_wall_s": wall}) + "\n")
            print(
                f"[mutation] from {args.from_report}: {len(done)} results kept, {len(again)} "
                "run again (unreached before, or survivors the reach map now gives more checks)",
                flush=True,
            )
        if not args.report_only:
            try:
                classified = load_survivors()
            except SurvivorFileError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="mutation-") as tmp, shared_folders():
                try:
                    _run_sample(
                        mutants,
                        done,
                        args.parallel,
                        Path(tmp),
                        reach,
                        recheck=args.recheck,
                        runs_file=runs_file,
                        history=history,
                        classified=classified,
                    )
                finally:  # an interrupted session counts too: its mutants are kept
                    session = time.perf_counter() - started
                    with runs_file.open("a") as f:
                        f.write(json.dumps({"session_wall_s": round(session, 1)}) + "\n")
                    wall += session
    try:
        report = build_report(
            mutants,
            done,
            total_candidates=len(everything),
            seed=seed,
            wall_s=wall,
            scope=scope_summary(reach, functions_in_scope()),
            history=history_digest,
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
