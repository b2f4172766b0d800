"""The results schema, shared by the writer (the pytest plugin, :mod:`harness.plugin.results`)
and the reader (the main job and the report, :mod:`harness.jobs.conformance`,
:mod:`harness.jobs.report`).

Two JSON documents, each with a ``schema_version``:

- a target's results (``results-<target>.json``): :class:`TargetResults`, one
  :class:`CheckResult` per check;
- the report (``conformance.json``): :class:`Report`, every target run and, per check, each
  target's :class:`CheckResult`.

The committed JSON Schemas (``fixtures/schema/``) describe the same records for other tools; the
harness's tests validate every document they produce against them.
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from harness import ROOT

#: Bumped when a record changes incompatibly; a reader refuses any other version.
SCHEMA_VERSION = 3
SCHEMA_DIR = ROOT / "fixtures" / "schema"
RESULTS_SCHEMA = SCHEMA_DIR / "results.schema.json"
REPORT_SCHEMA = SCHEMA_DIR / "conformance.schema.json"


class Outcome(enum.StrEnum):
    """A check's outcome on one target."""

    PASS = "pass"
    FAIL = "fail"  # a check failed, or a known deviation failed for another cause
    XFAIL = "xfail"  # a known deviation failed for its pinned cause
    XPASS = "xpass"  # a known deviation passed: its entry must go
    SKIP = "skip"
    ERROR = "error"  # set-up or tear-down failed


#: Outcomes that make a run fail.
FAILING = (Outcome.FAIL, Outcome.ERROR, Outcome.XPASS)


class CheckResult(TypedDict):
    id: str  # the pytest node id
    outcome: str  # an Outcome value
    reason: str
    runs_on: str | None  # what the check runs on (harness.runs_on.RUNS_ON)
    serving: str  # the serving configuration it ran under (harness.checkpoints.serving): its name
    serving_args: NotRequired[list[str]]  # that configuration's vllm serve options
    duration_s: float
    actual_cause: NotRequired[str]  # the exception behind an expected failure
    reach: NotRequired[str]  # how a user reaches the known deviation
    measured: NotRequired[dict[str, Any]]  # numbers the check measured (parity errors)
    self_consistency: NotRequired[str]  # what a check compares the target with itself on
    cause: NotRequired[dict[str, str]]  # a failure's type, frame and message (jobs.causes)


class TargetResults(TypedDict):
    """Written after collection and after every check, so that a target process that dies keeps
    what it finished; ``complete`` turns true when the pytest session ends normally."""

    schema_version: int
    target: dict[str, Any]  # identity: name, version, files, selector
    device: str
    exit_status: int | None  # pytest's, once the session ended; None while it runs
    complete: bool
    stopped: str  # why the session stopped before running its checks ("" when it did not)
    selected: int  # checks selected for this run (those not yet run are absent from `checks`)
    checks: list[CheckResult]
    stale_deviations: list[str]
    build_timings: dict[str, dict[str, float]]
    #: seconds per phase of the target's processes, summed over restarts and check groups
    #: (:data:`PHASES`)
    phases: NotRequired[dict[str, float]]
    #: the oracle's answers about requests (harness.oracles.cache.ANSWERED): read from its
    #: cache, computed and kept, computed and not kept; summed like the phases
    oracle_answers: NotRequired[dict[str, int]]


#: Fields of :class:`TargetResults` a results file may lack (the postponed annotations hide
#: ``NotRequired`` from ``__required_keys__``).
OPTIONAL_RESULTS_FIELDS = frozenset({"phases", "oracle_answers"})
#: The phases of a target's pytest processes, in order: the interpreter and pytest starting (from
#: the supervisor's start of the process, :data:`STARTED_AT_ENV`), collecting the checks,
#: importing the implementation, building the models, and the checks themselves (the rest).
PHASES = ("start_up_s", "collection_s", "import_s", "builds_s", "checks_s")
#: The wall-clock time (``time.time()``) at which the supervisor started a target's process.
STARTED_AT_ENV = "NEMOTRON_VL_STARTED_AT"


class IncidentKind(enum.StrEnum):
    """What the supervisor (:mod:`harness.jobs.supervisor`) did to, or saw of, a target process."""

    TIMEOUT = "timeout"  # a check ran past its time limit: killed, restarted from the next check
    MEMORY = "memory"  # the process went over its memory limit: killed, restarted
    CRASH = "crash"  # the process died (a signal, an early exit) before its session ended
    INTERRUPTED = "interrupted"  # the run was interrupted (Ctrl-C, SIGTERM)
    GAVE_UP = "gave up"  # too many restarts: the checks left were not run


class Incident(TypedDict):
    kind: str  # an IncidentKind value
    check: str | None  # the check that was running, or None (start-up, between checks)
    detail: str
    at_s: float  # seconds from the target's start to the incident


class TargetStatus(enum.StrEnum):
    """A target run's status in the report; every status but OK and FAILED exits 2."""

    OK = "ok"
    FAILED = "failed"  # a check failed (a time or memory limit included)
    CRASHED = "crashed"  # the target process died; the results written before it are kept
    INTERRUPTED = "interrupted"  # the run was stopped; the results finished before are kept
    INCOMPLETE = "incomplete"  # restarts ran out; checks were left unrun
    COULD_NOT_RUN = "could not run"  # the target failed to load, or the harness could not start


class Report(TypedDict):
    schema_version: int
    generated: str
    command: str
    targets: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    report_s: NotRequired[float]  # seconds to read every target's results into this report


class ResultsError(ValueError):
    """A results document the reader cannot use; the message names the file and the field."""


def read_results(path: Path) -> TargetResults:
    """A target's results as the plugin wrote them, its version and outcomes checked."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not JSON: {e}") from e
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: schema_version: expected {SCHEMA_VERSION}, got {version!r} (written by "
            "another version of the harness)"
        )
    missing = sorted(set(TargetResults.__annotations__) - OPTIONAL_RESULTS_FIELDS - set(data))
    if missing:
        raise ResultsError(f"{path}: expected the fields {missing}, got {sorted(data)}")
    known = {o.value for o in Outcome}
    for i, check in enumerate(data["checks"]):
        if check.get("outcome") not in known:
            raise ResultsError(
                f"{path}: checks[{i}].outcome: expected one of {sorted(known)}, got "
                f"{check.get('outcome')!r}"
            )
    return cast(TargetResults, data)


def replace_text(path: Path, text: str) -> None:
    """Replace ``path``'s contents in one step: a reader (the supervisor, watching a process that
    may die at any moment) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)


def write_results(path: Path, document: TargetResults) -> None:
    replace_text(path, json.dumps(document, indent=2) + "\n")


class StoppedCheck(TypedDict):
    """A check a fault stopped, as the supervisor hands it to the next pytest process, which
    records it (``--stopped-checks FILE``: a JSON list of these)."""

    id: str
    outcome: str  # a FAIL (time or memory limit) or an ERROR (the process died)
    reason: str


def write_stopped_checks(path: Path, checks: list[StoppedCheck]) -> None:
    replace_text(path, json.dumps(checks, indent=2) + "\n")


def read_stopped_checks(path: Path) -> list[StoppedCheck]:
    """The stopped checks in ``path``; :class:`ResultsError` naming the field that is wrong."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResultsError(f"{path}: expected a JSON list of stopped checks: {e}") from e
    if not isinstance(data, list):
        raise ResultsError(f"{path}: expected a JSON list, got {type(data).__name__}")
    allowed = {Outcome.FAIL.value, Outcome.ERROR.value}
    for i, check in enumerate(data):
        if not isinstance(check, dict) or not all(
            isinstance(check.get(key), str) for key in ("id", "outcome", "reason")
        ):
            raise ResultsError(f"{path}: [{i}]: expected id, outcome and reason strings")
        if check["outcome"] not in allowed:
            raise ResultsError(
                f"{path}: [{i}].outcome: expected one of {sorted(allowed)}, got "
                f"{check['outcome']!r}"
            )
    return cast(list[StoppedCheck], data)


#: pytest's exit status when it collected no check: a check group may be empty.
NO_CHECKS_COLLECTED = 5


def merge_groups(parts: list[TargetResults]) -> TargetResults:
    """One target's results from its check groups' (``--check-group K/N``, run side by side):
    the checks of every group, the selected counts summed, complete when every group is, the
    worst exit status, the deviations stale in every group that ran checks, the phases summed
    (processes' seconds, not wall time)."""
    if not parts:
        raise ValueError("merge_groups: expected the results of at least one group, got none")
    first = parts[0]
    statuses = [part["exit_status"] for part in parts]
    exit_status: int | None = None
    if all(status is not None for status in statuses):
        ran = [s for s in statuses if s is not None and s != NO_CHECKS_COLLECTED]
        exit_status = max(ran) if ran else NO_CHECKS_COLLECTED
    # A group that selected no check reports no stale entry: it saw none of them applied.
    seen = [set(part["stale_deviations"]) for part in parts if part["selected"]]
    stale = set.intersection(*seen) if seen else set()
    build_timings: dict[str, dict[str, float]] = {}
    for part in parts:
        for name, steps in part["build_timings"].items():
            build_timings.setdefault(name, steps)
    merged = TargetResults(
        schema_version=first["schema_version"],
        target=first["target"],
        device=first["device"],
        exit_status=exit_status,
        complete=all(part["complete"] for part in parts),
        stopped="; ".join(part["stopped"] for part in parts if part["stopped"]),
        selected=sum(part["selected"] for part in parts),
        checks=[check for part in parts for check in part["checks"]],
        stale_deviations=sorted(stale),
        build_timings=build_timings,
    )
    phases = [part["phases"] for part in parts if "phases" in part]
    if phases:
        merged["phases"] = {
            phase: round(sum(p.get(phase, 0.0) for p in phases), 2) for phase in PHASES
        }
    answers = [part["oracle_answers"] for part in parts if "oracle_answers" in part]
    if answers:
        merged["oracle_answers"] = add_counts(*answers)
    return merged


def add_counts(*counts: dict[str, int]) -> dict[str, int]:
    """Counts by name, summed."""
    total: dict[str, int] = {}
    for count in counts:
        for name, n in count.items():
            total[name] = total.get(name, 0) + n
    return total
