"""The conformance report: one row per check, one column per target run.

Input: the per-target results the pytest plugin writes (``--results-json``). Output:
``conformance.json`` (everything, machine-readable) and ``conformance.md`` (for people and CI
summaries), including each target's identity (name, version, file hashes) and known deviations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.jobs.results import (
    FAILING,
    SCHEMA_VERSION,
    CheckResult,
    IncidentKind,
    Outcome,
    Report,
    TargetResults,
    TargetStatus,
)
from harness.jobs.supervisor import Supervised
from harness.machine import cpu_family
from harness.oracles.engine_bounds import bounds_table, committed_calibration
from harness.runs_on import RUNS_ON

SHORT_PREFIX = "suites/conformance/"


@dataclass(frozen=True)
class TargetRun:
    """One target's pytest run: what the plugin wrote, or why nothing usable came back."""

    selector: str
    exit_status: int
    results: TargetResults | None
    problem: str = ""  # why no usable results came back (the verdict adds what they show)
    supervised: Supervised | None = None  # what the supervisor saw (faults, restarts, memory)
    #: a kept run's outcomes, reused (harness.jobs.kept): when it ran and its wall time
    reused: dict[str, Any] | None = None

    @property
    def checks(self) -> list[CheckResult]:
        return self.results["checks"] if self.results is not None else []

    @property
    def label(self) -> str:
        if self.results is not None:
            return str(self.results["target"]["name"])
        return self.selector


def _cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return "—"
    outcome, reason = check["outcome"], check.get("reason", "")
    runs_on = f" [{check['runs_on']}]" if check.get("runs_on") else ""
    if check.get("self_consistency"):
        runs_on += " (self-consistency)"
    if outcome == "pass":
        return "pass" + runs_on
    label = {"fail": "**FAIL**", "error": "**ERROR**", "xpass": "**XPASS**"}.get(outcome, outcome)
    reason = " ".join(reason.split())
    if len(reason) > 160:
        reason = reason[:157] + "..."
    if check.get("actual_cause"):
        actual = check["actual_cause"]
        reason += " — actual: " + (actual[:157] + "..." if len(actual) > 160 else actual)
    cell = f"{label}{runs_on}: {reason}" if reason else label + runs_on
    return cell.replace("|", "\\|")


def summarize(run: TargetRun) -> dict[str, int]:
    counts = {o.value: 0 for o in Outcome}
    for check in run.checks:
        counts[check["outcome"]] = counts.get(check["outcome"], 0) + 1
    return counts


def _runs_on_counts(run: TargetRun) -> dict[str, int]:
    counts: dict[str, int] = {}
    for check in run.checks:
        key = check.get("runs_on") or "unmarked"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _by_serving(run: TargetRun) -> dict[str, dict[str, Any]]:
    """The run's outcomes grouped by the serving configuration each check ran under."""
    groups: dict[str, dict[str, Any]] = {}
    for check in run.checks:
        name = check.get("serving") or "default"
        group = groups.setdefault(
            name, {"args": list(check.get("serving_args", [])), "outcomes": {}}
        )
        outcomes = group["outcomes"]
        outcomes[check["outcome"]] = outcomes.get(check["outcome"], 0) + 1
    return dict(sorted(groups.items(), key=lambda item: (item[0] != "default", item[0])))


def _deviations_by_reach(run: TargetRun) -> dict[str, list[str]]:
    """The run's expected failures by how a user reaches them (the deviation's ``reach``)."""
    groups: dict[str, list[str]] = {}
    for check in run.checks:
        if check["outcome"] == Outcome.XFAIL:
            groups.setdefault(check.get("reach") or "unstated", []).append(check["id"])
    return {reach: sorted(ids) for reach, ids in sorted(groups.items())}


def _measured(run: TargetRun) -> dict[str, Any]:
    """What the run's checks measured (parity errors), by check id."""
    return {check["id"]: check["measured"] for check in run.checks if check.get("measured")}


@dataclass(frozen=True)
class Verdict:
    """A target run's status, and what stopped the harness from running it (empty: nothing)."""

    status: TargetStatus
    problem: str


def verdict(run: TargetRun) -> Verdict:
    """The one place a run's verdict is decided: faults the supervisor saw come first, then
    what the results show (a target that stopped itself, pytest's exit status, no checks),
    then the checks' outcomes."""
    incidents = run.supervised.incidents if run.supervised else []
    kinds = {IncidentKind(i["kind"]) for i in incidents}
    problem = run.problem
    results = run.results
    if results is not None and not problem:
        if results["stopped"]:
            problem = results["stopped"]
        elif not results["checks"] and not incidents:
            problem = "no conformance checks ran"
        elif results["complete"] and run.exit_status not in (0, 1, 5):
            # 5: pytest ran nothing new, as when a restart found every check already recorded
            problem = f"pytest exited {run.exit_status} (the harness could not run this target)"
    if IncidentKind.INTERRUPTED in kinds:
        return Verdict(TargetStatus.INTERRUPTED, problem)
    if results is None or problem:
        status = TargetStatus.CRASHED if IncidentKind.CRASH in kinds else TargetStatus.COULD_NOT_RUN
        return Verdict(status, problem)
    if IncidentKind.CRASH in kinds:
        return Verdict(TargetStatus.CRASHED, problem)
    if IncidentKind.GAVE_UP in kinds or any(i["check"] is None for i in incidents):
        return Verdict(TargetStatus.INCOMPLETE, problem)  # checks were left unrun
    if not results["complete"] and not incidents:
        return Verdict(TargetStatus.INCOMPLETE, problem)
    if any(summarize(run)[o] for o in FAILING) or run.exit_status not in (0, 5):
        return Verdict(TargetStatus.FAILED, problem)
    return Verdict(TargetStatus.OK, problem)


def _supervision(run: TargetRun) -> dict[str, Any]:
    supervised = run.supervised
    if supervised is None:
        return {
            "incidents": [],
            "restarts": 0,
            "wall_s": None,
            "peak_memory_gib": None,
            "slowest_check": None,
            "derived_check_timeout_s": None,
            "past_derived_limit": [],
            "processes": {"forked": 0, "new": 0},
        }
    slowest = supervised.slowest_check
    return {
        "incidents": list(supervised.incidents),
        "wall_s": supervised.wall_s,
        "restarts": supervised.restarts,
        "peak_memory_gib": round(supervised.peak_memory_gib, 3),
        "slowest_check": {"id": slowest[0], "wall_s": slowest[1]} if slowest else None,
        "derived_check_timeout_s": supervised.derived_check_timeout_s,
        "past_derived_limit": list(supervised.past_derived_limit),
        "processes": {"forked": supervised.forked, "new": supervised.started_new},
    }


def build_report(runs: Sequence[TargetRun], command: str = "") -> Report:
    started = time.perf_counter()
    check_ids: list[str] = []
    for run in runs:
        for check in run.checks:
            if check["id"] not in check_ids:
                check_ids.append(check["id"])
    by_run = [{c["id"]: c for c in run.checks} for run in runs]
    report: Report = {
        "schema_version": SCHEMA_VERSION,
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "targets": [
            {
                "selector": run.selector,
                "identity": run.results["target"] if run.results else None,
                "device": run.results["device"] if run.results else None,
                "pytest_exit_status": run.exit_status,
                "status": decided.status,
                "problem": decided.problem,
                "summary": summarize(run),
                "stale_deviations": run.results["stale_deviations"] if run.results else [],
                # A reused target spent no time here: its kept run's timings are not this run's.
                "build_timings": (
                    run.results["build_timings"] if run.results and not run.reused else {}
                ),
                "phases": (run.results.get("phases") if run.results and not run.reused else None),
                "oracle_answers": (
                    run.results.get("oracle_answers") if run.results and not run.reused else None
                ),
                "reused": run.reused,
                "runs_on": _runs_on_counts(run),
                "by_serving": _by_serving(run),
                "deviations_by_reach": _deviations_by_reach(run),
                "measured": _measured(run),
                **_supervision(run),
            }
            for run, decided in zip(runs, map(verdict, runs), strict=True)
        ],
        "checks": [
            {
                "id": check_id,
                "results": {
                    run.selector: results.get(check_id)
                    for run, results in zip(runs, by_run, strict=True)
                },
            }
            for check_id in sorted(check_ids)
        ],
    }
    report["report_s"] = round(time.perf_counter() - started, 3)
    return report


def exit_status(report: Report) -> int:
    """0: every check passed or failed as a known deviation; 1: a check failed; 2: the run is
    incomplete (a target could not run, crashed, ran out of restarts, or was interrupted)."""
    statuses = [t["status"] for t in report["targets"]]
    if not statuses or any(s not in (TargetStatus.OK, TargetStatus.FAILED) for s in statuses):
        return 2
    return 1 if TargetStatus.FAILED in statuses else 0


def render_markdown(report: Report) -> str:
    targets = report["targets"]
    lines = [
        "# Nano-Nemotron VL conformance report",
        "",
        f"Generated {report['generated']}"
        + (f" by `{report['command']}`" if report["command"] else "")
        + ".",
        f"Overall: **{['ok', 'a check failed', 'the run is incomplete'][exit_status(report)]}** "
        f"(exit status {exit_status(report)}).",
        "",
        "## Targets",
        "",
        "| target | version | device | status | pass | fail | expected-fail | unexpected pass"
        " | skip | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        ident = t["identity"] or {}
        s = t["summary"]
        lines.append(
            f"| `{t['selector']}` | {ident.get('version', '?')} | {t['device'] or '?'} | "
            f"{t['status']} | {s['pass']} | {s['fail']} | {s['xfail']} | {s['xpass']} | "
            f"{s['skip']} | {s['error']} |"
        )
    for t in targets:
        if t["problem"]:
            lines += ["", f"**`{t['selector']}` {t['status']}:** {t['problem']}"]
    adapted = [(t, a) for t in targets for a in (t["identity"] or {}).get("adaptations") or []]
    if adapted:
        lines += ["", "Adapted so that the release runs on this machine:", ""]
        lines += [
            f"- `{t['selector']}`: **{a['name']}**: {a['what']}. What the checks compare is "
            f"unchanged: {a['why_unchanged']}."
            for t, a in adapted
        ]
    reused = [t for t in targets if t.get("reused")]
    if reused:
        lines += ["", "Not run again (`harness/jobs/kept.py`; `--rerun` runs them):", ""]
        lines += [
            f"- `{t['selector']}`: its outcomes are those of its run that ended at "
            f"{t['reused']['kept_at']}"
            + (f" ({t['reused']['wall_s']:g} s)" if t["reused"].get("wall_s") is not None else "")
            + ", reused: every file it imported, the fixtures, its options and the environment "
            "are unchanged since."
            for t in reused
        ]
    lines += _incident_section(targets)
    meanings = "; ".join(f"{what}: {meaning}" for what, meaning in RUNS_ON.items())
    lines += ["", f"What the checks run on ({meanings}):", ""]
    for t in targets:
        counts = ", ".join(f"{n} on {what}" for what, n in sorted(t.get("runs_on", {}).items()))
        lines.append(f"- `{t['selector']}`: {counts or 'nothing recorded'}")
    timed = [t for t in targets if t.get("build_timings")]
    if timed:
        lines += ["", "Building the real models (seconds):", ""]
        for t in timed:
            for what, steps in t["build_timings"].items():
                parts = ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in steps.items())
                lines.append(f"- `{t['selector']}` {what}: {parts}")
    lines += _phase_section(targets, report.get("report_s"))
    lines += _serving_section(targets)
    lines += _pairs_section(report)
    lines += covered_space_section(ROOT / "reports")
    lines += _self_consistency_section(report)
    lines += _reach_section(targets) + _measured_section(targets)
    lines += _engine_bounds_section(targets)
    lines += ["", "Files under test:", ""]
    for t in targets:
        for path, digest in ((t["identity"] or {}).get("files") or {}).items():
            lines.append(f"- `{t['selector']}`: `{path}` sha256 `{digest[:16]}…`")
    lines += ["", "## Checks", ""]
    header = "| check | serving | " + " | ".join(f"`{t['selector']}`" for t in targets) + " |"
    lines += [header, "|---" * (len(targets) + 2) + "|"]
    for check in report["checks"]:
        results = [check["results"].get(t["selector"]) for t in targets]
        serving = next((r.get("serving") for r in results if r and r.get("serving")), "default")
        cells = [_cell(result) for result in results]
        lines.append(
            f"| `{check['id'].removeprefix(SHORT_PREFIX)}` | {serving} | "
            + " | ".join(cells)
            + " |"
        )
    stale = [(t["selector"], s) for t in targets for s in t["stale_deviations"]]
    if stale:
        lines += ["", "## Stale deviation entries (match no check; remove or rename them)", ""]
        lines += [f"- `{sel}`: `{check}`" for sel, check in stale]
    lines += [
        "",
        "Legend: *pass*; **FAIL** (a check failed, or a known deviation failed for another "
        "reason than its pinned cause); *xfail* (a known deviation listed in "
        "`fixtures/deviations/`, with its reason and the actual exception); **XPASS** (a known "
        "deviation now passes: remove its entry); *skip* (not applicable here, with the reason).",
        "",
    ]
    return "\n".join(lines)


def _incident_section(targets: list[dict[str, Any]]) -> list[str]:
    """Faults the supervisor handled: what, in which check, when; and each target's peak memory
    and slowest check (what the limits must leave room for)."""
    lines: list[str] = []
    for t in targets:
        for incident in t.get("incidents") or []:
            where = f"in `{incident['check']}`" if incident["check"] else "outside any check"
            lines.append(
                f"- `{t['selector']}` **{incident['kind']}** {where} at {incident['at_s']:g} s: "
                f"{incident['detail']}"
            )
    if lines:
        lines = [
            "",
            "Faults (the target process was killed or died; see `--check-timeout`, "
            "`--memory-limit`, `--max-restarts`):",
            "",
            *lines,
        ]
    usage = [
        f"- `{t['selector']}`: peak memory {t['peak_memory_gib']} GiB; slowest check "
        f"{t['slowest_check']['wall_s']} s (`{t['slowest_check']['id']}`); "
        f"{t['restarts']} restarts"
        + (
            f"; after the first timeout each check ran under a derived limit of "
            f"{t['derived_check_timeout_s']:g} s"
            if t.get("derived_check_timeout_s") is not None
            else ""
        )
        + (
            f" ({len(t['past_derived_limit'])} went past it where no check that timed out was "
            "stuck, and kept the full limit)"
            if t.get("past_derived_limit")
            else ""
        )
        for t in targets
        if t.get("peak_memory_gib") is not None and t.get("slowest_check")
    ]
    if usage:
        lines += ["", "Supervision (wall time per check includes its set-up):", "", *usage]
    return lines


def _serving_section(targets: Sequence[dict[str, Any]]) -> list[str]:
    """Each target's outcomes per serving configuration, with the command that serves it."""
    names: dict[str, list[str]] = {}
    for t in targets:
        for name, group in t.get("by_serving", {}).items():
            names.setdefault(name, group["args"])
    if not names:
        return []
    lines = [
        "",
        "## Serving configurations",
        "",
        "Each check runs under one serving configuration (`harness/checkpoints/serving.py`): the "
        "options of `vllm serve FOLDER` it changes from the default (the checkpoint's dtype, "
        "vLLM's defaults, `--enable-mm-embeds`); the reference applies the same options in its "
        "own terms.",
        "",
        "| configuration | options | " + " | ".join(f"`{t['selector']}`" for t in targets) + " |",
        "|---" * (len(targets) + 2) + "|",
    ]
    for name, args in names.items():
        cells = []
        for t in targets:
            outcomes = t.get("by_serving", {}).get(name, {}).get("outcomes", {})
            cells.append(", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "—")
        options = ("`" + " ".join(args) + "`" if args else "(none: vLLM's defaults)").replace(
            "|", "\\|"
        )
        lines.append(f"| {name} | {options} | " + " | ".join(cells) + " |")
    return lines


#: The check that runs each variant of the covering array (its parameter: the variant's slug).
PAIRWISE_CHECK = (
    "suites/conformance/test_pairwise.py::"
    "test_a_variant_of_the_covering_array_serves_the_catalogue_as_the_reference"
)


def _pairs_section(report: Report) -> list[str]:
    """Each variant of the covering array, the options it changes and its outcome per target."""
    from harness.checkpoints.pairs import AXES, changed_options, covering_array

    checks = {c["id"]: c for c in report["checks"] if c["id"].startswith(PAIRWISE_CHECK)}
    if not checks:
        return []
    targets = report["targets"]
    variants = covering_array()
    lines = [
        "",
        "## Pairs of options",
        "",
        f"The checkpoint variants of an all-pairs covering array over {len(AXES)} options "
        f"({', '.join(AXES)}; `harness/checkpoints/pairs.py`): any two options' values meet in "
        f"some variant; {len(variants)} builds. Each serves one form per path against the "
        "reference (`suites/conformance/test_pairwise.py`).",
        "",
        "| variant | options changed from the default | "
        + " | ".join(f"`{t['selector']}`" for t in targets)
        + " |",
        "|---" * (len(targets) + 2) + "|",
    ]
    for spec in variants:
        check = checks.get(f"{PAIRWISE_CHECK}[{spec.slug}]")
        changed = ", ".join(f"{k}={v}" for k, v in changed_options(spec).items()) or "none"
        cells = [_cell(check["results"].get(t["selector"]) if check else None) for t in targets]
        lines.append(f"| `{spec.slug}` | {changed} | " + " | ".join(cells) + " |")
    return lines


def covered_space_section(reports: Path) -> list[str]:
    """What the checks cover, as the committed reports measured it: the config-field inventory's
    verdicts and the fields it leaves uncaught (``config-fields.json``), and the reach map's
    summary of the model's lines no check reaches, each with its reason (``unreached.md``)."""
    lines: list[str] = []
    inventory = reports / "config-fields.json"
    if inventory.is_file():
        document = json.loads(inventory.read_text())
        counts = ", ".join(f"{n} {verdict}" for verdict, n in document["verdicts"].items())
        lines += [
            "",
            "## Config fields, and lines no check reaches",
            "",
            f"Config fields the model's vLLM code reads (`{inventory.name}`, "
            f"`nox -s config-fields`, vLLM {document['meta'].get('vllm', '?')}): {counts}.",
        ]
        for verdict in ("not caught", "variant needs CUDA", "no variant"):
            names = [
                f"`{f['section']}.{f['field']}`"
                for f in document["fields"]
                if f["verdict"] == verdict
            ]
            if names:
                lines.append(f"- {verdict}: {', '.join(names)}")
    unreached = reports / "unreached.md"
    if unreached.is_file():
        summary = next(
            (line for line in unreached.read_text().splitlines() if line and line[0].isdigit()),
            "",
        )
        text = unreached.read_text().splitlines()
        start = text.index("| reason | lines |") if "| reason | lines |" in text else len(text)
        table = []
        for line in text[start:]:
            if not line.startswith("|"):
                break
            table.append(line)
        lines += ["", f"Lines no check reaches (`{unreached.name}`, `nox -s reach`): {summary}"]
        lines += ["", *table] if table else []
    return lines


def _self_consistency_section(report: Report) -> list[str]:
    """Checks whose expectation comes from the target itself (order, determinism, threads):
    they catch a target that disagrees with itself, not one that is consistently wrong."""
    found: dict[str, str] = {}
    for check in report["checks"]:
        for result in check["results"].values():
            if result is not None and result.get("self_consistency"):
                found[check["id"]] = result["self_consistency"]
    if not found:
        return []
    lines = [
        "",
        f"Self-consistency checks ({len(found)}): each compares a target with itself, not with "
        "an expectation from outside it (the other checks' expectations come from the "
        "architecture's formulas, hand-worked tables or the other implementation):",
        "",
    ]
    lines += [
        f"- `{cid.removeprefix(SHORT_PREFIX)}`: {what}" for cid, what in sorted(found.items())
    ]
    return lines


def _reach_section(targets: list[dict[str, Any]]) -> list[str]:
    """Known deviations by how a user reaches them: a request, the engine's set-up, or only a
    direct call of the model's methods (a contract no request reaches)."""
    from harness.jobs.deviations import REACHES

    lines: list[str] = []
    for t in targets:
        groups = t.get("deviations_by_reach") or {}
        if not groups:
            continue
        lines += ["", f"Known deviations of `{t['selector']}` by how a user reaches them:", ""]
        for reach, ids in groups.items():
            what = REACHES.get(reach, "not stated in the deviation file")
            lines.append(f"- **{reach}** ({len(ids)}): {what}")
    return lines


#: The phases of a target's processes (harness.jobs.results.PHASES) as the report heads them.
_PHASE_HEADS = {
    "start_up_s": "start-up",
    "collection_s": "collection",
    "import_s": "import",
    "builds_s": "model builds",
    "checks_s": "checks",
}


def _phase_section(targets: list[dict[str, Any]], report_s: float | None) -> list[str]:
    """Where each target's time went: its processes' phases, and the wall time around them;
    then the report's own."""
    timed = [t for t in targets if t.get("phases")]
    if not timed:
        return []
    lines = [
        "",
        "Where the time went (seconds; a target's processes summed over restarts and over the "
        "groups that ran side by side, wall time as the supervisor saw it):",
        "",
        "| target | " + " | ".join(_PHASE_HEADS.values()) + " | wall |",
        "|---" * (len(_PHASE_HEADS) + 2) + "|",
    ]
    for t in timed:
        phases = [f"{t['phases'].get(phase, 0.0):.1f}" for phase in _PHASE_HEADS]
        wall = "" if t.get("wall_s") is None else f"{t['wall_s']:.1f}"
        lines.append(f"| `{t['selector']}` | " + " | ".join(phases) + f" | {wall} |")
    started = [
        (t["selector"], t["processes"]) for t in timed if sum(t.get("processes", {}).values())
    ]
    if started:
        lines += [
            "",
            "Target processes (restarts and groups included): "
            + "; ".join(
                f"`{selector}` {p['forked']} forked from a server that imported torch (and "
                f"vLLM for vLLM's targets) once, {p['new']} started as a new Python"
                for selector, p in started
            )
            + " (harness/jobs/forkserver.py; `--no-fork-server` starts each new).",
        ]
    for t in timed:
        answers = t.get("oracle_answers") or {}
        if any(answers.values()):
            lines += [
                "",
                f"The oracle's answers for `{t['selector']}` (the reference, on the parity "
                f"checks' requests): {answers.get('hits', 0)} read from its cache, "
                f"{answers.get('misses', 0)} computed and kept, {answers.get('uncached', 0)} "
                "computed and not kept (harness/oracles/cache.py).",
            ]
    if report_s is not None:
        lines += ["", f"Reading the results into this report: {report_s:.2f} s."]
    return lines


def _measured_section(targets: list[dict[str, Any]]) -> list[str]:
    """What the checks measured, by kind (:data:`_MEASURED_KINDS`)."""
    lines: list[str] = []
    for t in targets:
        by_kind: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
        for check_id, items in sorted((t.get("measured") or {}).items()):
            # A parametrised check by its parameter (the request form), another by its name.
            form = (
                check_id.rpartition("[")[2].rstrip("]")
                if check_id.endswith("]")
                else check_id.rpartition("::")[2]
            )
            for item, numbers in items.items():
                by_kind.setdefault(numbers.get("kind", "parity"), []).append((form, item, numbers))
        for kind, heading, render in _MEASURED_KINDS:
            if kind in by_kind:
                lines += ["", heading.format(f"`{t['selector']}`"), "", *render(by_kind[kind])]
    return lines


def _engine_bounds_section(targets: list[dict[str, Any]]) -> list[str]:
    """The bounds the engine checks judged by, and the CPU families they were calibrated on,
    where an engine target ran."""
    if not any(t["selector"].startswith("vllm-engine") for t in targets):
        return []
    calibration = committed_calibration()
    return [
        "",
        "The engine's log-probability bounds (harness.oracles.engine_bounds), one per "
        "comparison, derived from every CPU family's calibration at once:",
        "",
        *bounds_table(calibration, cpu_family()),
    ]


def _bounds_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Per parity path and dtype: the bounds, how they were derived, and the largest error of
    this run by each statistic."""
    paths: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _, _, numbers in entries:
        if "path" in numbers and "global_bound" in numbers:
            paths.setdefault((numbers["path"], numbers["dtype"]), []).append(numbers)
    if not paths:
        return []
    lines = [
        "| path | dtype | items | largest error / bound: global | row | channel | bounds from |",
        "|---|---|---|---|---|---|---|",
    ]
    for (path, dtype), items in sorted(paths.items()):
        worst = []
        for statistic in ("global", "row", "channel"):
            error = max(n[f"{statistic}_error"] for n in items)
            worst.append(f"{error:.3g} / {items[0][f'{statistic}_bound']:.3g}")
        lines.append(
            f"| {path} | {dtype} | {len(items)} | {' | '.join(worst)} | "
            f"{items[0].get('bound_source', '')} |"
        )
    methods = {(p, d): items[0].get("bound_method") for (p, d), items in paths.items()}
    lines += ["", "How each global bound was derived (harness.oracles.bounds):", ""]
    lines += [f"- {p} ({d}): {m}" for (p, d), m in sorted(methods.items()) if m]
    return [*lines, ""]


def _parity_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    parts: dict[str, list[str]] = {}
    for form, item, numbers in entries:
        if numbers.get("exact"):
            part = f"{item} exact"
        else:
            exact = numbers.get("separator_rows_exact", 0)
            part = (
                f"{item} {numbers['relative_error']:.2e} ≤ {numbers['bound']:.3g} "
                f"({numbers['dtype']}" + (f"; {exact} separator rows exact)" if exact else ")")
            )
        parts.setdefault(form, []).append(part)
    return _bounds_lines(entries) + [
        f"- {form}: " + ", ".join(items) for form, items in parts.items()
    ]


def _sensitivity_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [
        f"- {path}: {n['difference']:.3g} / {n['bound']:.3g} ({n['dtype']}) = {n['ratio']:.3g}x "
        f"(at least {n['minimum_ratio']:g}x)"
        for _, path, n in entries
    ]


def _feature_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [
        f"- {form} {item}: {n['max_abs_error']:.3g} ({n['dtype']}; atol {n['atol']:.3g}, "
        f"rtol {n['rtol']:.3g})"
        for form, item, n in entries
    ]


def _lora_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [
        f"- {module}: {n['max_token_error']:.3g} ≤ {n['bound']:.3g}" for _, module, n in entries
    ]


def _engine_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    def shown(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    return [
        f"- {form}, {item}: "
        + ", ".join(
            f"{name.replace('_', ' ')} {shown(v)}" for name, v in n.items() if name != "kind"
        )
        for form, item, n in entries
    ]


def _server_lines(entries: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """As the engine's, with a failed check's server log tail as a block of its own."""
    lines: list[str] = []
    for form, item, numbers in entries:
        tail = numbers.get("tail")
        if isinstance(tail, str):
            lines += [f"- {form}, {item}:", "", "  ```text"]
            lines += [f"  {line}" for line in tail.splitlines()] + ["  ```", ""]
        else:
            lines += _engine_lines([(form, item, numbers)])
    return lines


#: Each kind of measured numbers (a measured entry's ``kind``; parity when it has none): its
#: heading and how its entries are listed.
_MEASURED_KINDS: tuple[
    tuple[str, str, Callable[[list[tuple[str, str, dict[str, Any]]]], list[str]]], ...
] = (
    (
        "parity",
        "Parity of {} with the reference (relative error per item, bound; exact where the rows "
        "are given or looked up):",
        _parity_lines,
    ),
    (
        "sensitivity",
        "Sensitivity of {} per path (relative difference of two inputs' rows, in parity bounds):",
        _sensitivity_lines,
    ),
    (
        "features",
        "Features before the towers of {} against the reference's (largest elementwise error; "
        "bound atol + rtol |x|):",
        _feature_lines,
    ),
    (
        "lora",
        "LoRA layers of {} against W x + s B A x from the adapter files (largest relative error "
        "of a token in a batch of three adapters and none, bound):",
        _lora_lines,
    ),
    (
        "engine",
        "The engine {} against the reference's language model, or against itself (log-"
        "probability differences in nats, each with its bound; greedy steps agreed):",
        _engine_lines,
    ),
    (
        "server",
        "The OpenAI-compatible server of {}: what each check sent over HTTP and what came back "
        "(the status and message of a refusal; log-probability differences in nats against the "
        "engine's answer to the same prompt, each with its bound; a failed check's server log "
        "tail):",
        _server_lines,
    ),
)


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "conformance.json", out_dir / "conformance.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path
