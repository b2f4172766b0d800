"""Record each conformance check's outcome as JSON (``--results-json PATH``) for the report.

The file is rewritten (atomically) after collection and after every check, so a target process
that dies keeps what it finished. More options serve the supervising main job
(:mod:`harness.jobs.supervisor`): ``--progress-file PATH`` holds the id of the check now running
(empty between checks; the process also answers where a running check is,
:mod:`harness.jobs.stacks`), ``--resume`` keeps the checks already in the results file and runs the
rest, and ``--stopped-checks FILE`` records the checks a fault stopped in an earlier process
(with what they run on and their serving configuration) without running them again
(``--record-stopped-only``: records them and runs no check).
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from pathlib import Path

import pluggy
import pytest

from harness import ROOT
from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.jobs.causes import cause_of
from harness.jobs.kept import record_imports
from harness.jobs.results import (
    PHASES,
    SCHEMA_VERSION,
    STARTED_AT_ENV,
    CheckResult,
    Outcome,
    ResultsError,
    StoppedCheck,
    TargetResults,
    add_counts,
    read_results,
    read_stopped_checks,
    replace_text,
    write_results,
)
from harness.jobs.stacks import answer_stack_requests
from harness.oracles.cache import answered
from harness.plugin.deviations import is_check, stale_deviations
from harness.plugin.groups import keep_group
from harness.plugin.target import STOPPED_KEY, current_target, runs_on


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nemotron-vl").addoption(
        "--results-json",
        default=None,
        metavar="PATH",
        help="write each conformance check's outcome and the target's identity to PATH",
    )
    parser.getgroup("nemotron-vl").addoption(
        "--progress-file",
        default=None,
        metavar="PATH",
        help="keep the id of the check now running in PATH (for a supervising process)",
    )
    parser.getgroup("nemotron-vl").addoption(
        "--resume",
        action="store_true",
        help="keep the checks already in --results-json and run only the others",
    )
    parser.getgroup("nemotron-vl").addoption(
        "--stopped-checks",
        default=None,
        metavar="FILE",
        help="record the checks a fault stopped in an earlier process (a JSON list of id, "
        "outcome, reason) and do not run them again",
    )
    parser.getgroup("nemotron-vl").addoption(
        "--record-stopped-only",
        action="store_true",
        help="record the --stopped-checks and run no check",
    )


def pytest_configure(config: pytest.Config) -> None:
    for option in ("--resume", "--stopped-checks", "--record-stopped-only", "--check-group"):
        if config.getoption(option) and not config.getoption("--results-json"):
            raise pytest.UsageError(f"{option}: expected --results-json PATH, got none")
    if config.getoption("--results-json"):
        config.pluginmanager.register(ResultsRecorder(config), "nemotron-vl-results")
    if config.getoption("--progress-file"):
        config.pluginmanager.register(
            ProgressFile(Path(config.getoption("--progress-file"))), "nemotron-vl-progress"
        )


class ProgressFile:
    """The id of the check now running, for a supervisor that enforces time limits and names the
    check a dead process was running; the process answers the supervisor's question of where a
    check is (:mod:`harness.jobs.stacks`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        answer_stack_requests(path)  # before any check runs: the supervisor asks during one
        replace_text(path, "")

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        replace_text(self.path, nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        replace_text(self.path, "")


def serving_of(item: pytest.Item) -> ServingConfig:
    """The serving configuration a check runs under: the :class:`ServingConfig` among its
    parameters, else :data:`DEFAULT_SERVING` (unless the check records another as its
    ``serving`` property)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    found = [value for value in params if isinstance(value, ServingConfig)]
    return found[0] if found else DEFAULT_SERVING


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).strip()
    if isinstance(report.longrepr, tuple):  # skips: (path, line, reason)
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    lines = str(report.longrepr or "").strip().splitlines()
    return lines[-1] if lines else ""


def classify(report: pytest.TestReport) -> tuple[Outcome, str] | None:
    """The outcome a report decides, with its reason; None when it decides nothing."""
    xfail_reason = getattr(report, "wasxfail", None)
    if report.when == "call":
        if xfail_reason is not None:
            if report.skipped:
                return Outcome.XFAIL, xfail_reason
            return Outcome.XPASS, f"unexpected pass of a known deviation: {xfail_reason}"
        if report.passed:
            return Outcome.PASS, ""
        if report.failed:
            message = _message(report)
            if message.startswith("[XPASS(strict)]"):
                reason = message.removeprefix("[XPASS(strict)]").strip()
                return Outcome.XPASS, f"unexpected pass of a known deviation: {reason}"
            return Outcome.FAIL, message
        return Outcome.SKIP, _message(report)
    if report.failed:
        return Outcome.ERROR, f"{report.when}: {_message(report)}"
    if report.skipped:
        if xfail_reason is not None:
            return Outcome.XFAIL, xfail_reason
        return Outcome.SKIP, _message(report)
    return None


class ResultsRecorder:
    """Collects one outcome per check and writes them when the session ends."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.path = Path(config.getoption("--results-json"))
        self.check_ids: set[str] = set()
        self.runs_on: dict[str, str | None] = {}
        self.serving: dict[str, ServingConfig] = {}
        self.self_consistency: dict[str, str] = {}
        self.results: dict[str, CheckResult] = {}
        self.build_timings: dict[str, dict[str, float]] = {}
        self.identity: dict[str, object] | None = None  # hashed once, written after every check
        # Where this process's time goes (PHASES), added to what earlier processes spent.
        self.configured_at = time.time()
        self.collection_started: float | None = None
        self.collection_finished: float | None = None
        self.earlier_phases: dict[str, float] = {}
        self.earlier_answers: dict[str, int] = {}
        if config.getoption("--resume") and self.path.is_file():
            try:
                earlier = read_results(self.path)
            except ResultsError as e:
                raise pytest.UsageError(f"--resume: {e}") from e
            self.results = {check["id"]: check for check in earlier["checks"]}
            self.build_timings = dict(earlier["build_timings"])
            self.earlier_phases = dict(earlier.get("phases") or {})
            self.earlier_answers = dict(earlier.get("oracle_answers") or {})
        self.stopped: dict[str, StoppedCheck] = {}
        if config.getoption("--stopped-checks"):
            try:
                stopped = read_stopped_checks(Path(config.getoption("--stopped-checks")))
            except ResultsError as e:
                raise pytest.UsageError(f"--stopped-checks: {e}") from e
            self.stopped = {check["id"]: check for check in stopped}
        self.record_only = bool(config.getoption("--record-stopped-only"))

    @pytest.hookimpl(trylast=True)  # after the deviations are applied (stale-entry detection)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        keep_group(config, items)  # this process's share of the target's checks
        self.check_ids = {item.nodeid for item in items if is_check(item)}
        self.runs_on = {item.nodeid: runs_on(item) for item in items if is_check(item)}
        self.serving = {item.nodeid: serving_of(item) for item in items if is_check(item)}
        self.self_consistency = {
            item.nodeid: str(marker.args[0])
            for item in items
            if is_check(item) and (marker := item.get_closest_marker("self_consistency"))
        }
        for item in items:
            if (
                item.nodeid in self.check_ids
                and item.nodeid in self.stopped
                and (item.nodeid not in self.results)
            ):
                stopped = self.stopped[item.nodeid]
                serving = self.serving[item.nodeid]
                self.results[item.nodeid] = CheckResult(
                    id=item.nodeid,
                    outcome=stopped["outcome"],
                    reason=stopped["reason"],
                    runs_on=self.runs_on.get(item.nodeid),
                    serving=serving.name,
                    serving_args=serving.cli_args(),
                    duration_s=0.0,
                )
        done = [
            item
            for item in items
            if item.nodeid in self.results or item.nodeid in self.stopped or self.record_only
        ]
        if done:  # resuming: what an earlier process finished is not run again
            items[:] = [item for item in items if item not in done]
            config.hook.pytest_deselected(items=done)

    def pytest_collection(self, session: pytest.Session) -> None:
        self.collection_started = time.time()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collection_finished = time.time()
        self.write(exit_status=None, complete=False)

    def phases(self, timings: dict[str, dict[str, float]]) -> dict[str, float]:
        """Seconds per phase (:data:`PHASES`) of this process so far, plus earlier ones'."""
        now = time.time()
        started = os.environ.get(STARTED_AT_ENV)
        try:
            start_up = self.configured_at - float(started) if started else 0.0
        except ValueError:
            start_up = 0.0
        collecting = (self.collection_finished or now) - (self.collection_started or now)
        imported = sum(
            steps.get("import_s", 0.0) for what, steps in timings.items() if what == "import"
        )
        built = sum(
            value for what, steps in timings.items() if what != "import" for value in steps.values()
        )
        running = now - self.collection_finished if self.collection_finished else 0.0
        ours = {
            "start_up_s": max(start_up, 0.0),
            "collection_s": max(collecting, 0.0),
            "import_s": imported,
            "builds_s": built,
            "checks_s": max(running - imported - built, 0.0),
        }
        return {
            phase: round(ours[phase] + self.earlier_phases.get(phase, 0.0), 2) for phase in PHASES
        }

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
        """A failed check's report carries its cause (:func:`harness.jobs.causes.cause_of`):
        the gate groups regressions by it. So does an expected failure's (the xfail's): the
        known deviations' hook, which runs after this one, fails it where its cause is not the
        pinned one, and that regression's cause is this exception."""
        outcome = yield
        report = outcome.get_result()
        excinfo = call.excinfo
        expected = bool(getattr(report, "wasxfail", None))
        if excinfo is None or not (report.failed or expected) or item.nodeid not in self.check_ids:
            return
        cause = cause_of(excinfo.type, excinfo.value, excinfo.tb, item.path, ROOT)
        report.user_properties = [*report.user_properties, ("cause", cause)]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.check_ids:
            return
        decided = classify(report)
        if decided is None:
            return
        previous = self.results.get(report.nodeid)
        if previous is not None and previous["outcome"] in (
            Outcome.FAIL,
            Outcome.ERROR,
            Outcome.XPASS,
        ):
            return  # a teardown pass never hides a call failure
        outcome, reason = decided
        result = CheckResult(
            id=report.nodeid,
            outcome=outcome.value,
            reason=reason,
            runs_on=self.runs_on.get(report.nodeid),
            serving=DEFAULT_SERVING.name,
            duration_s=round(report.duration, 4),
        )
        properties = dict(report.user_properties)
        # A check that makes its configuration inside says so with record_property("serving").
        serving = properties.get("serving")
        if not isinstance(serving, ServingConfig):
            serving = self.serving.get(report.nodeid, DEFAULT_SERVING)
        result["serving"], result["serving_args"] = serving.name, serving.cli_args()
        if "actual_cause" in properties:  # the exception behind an expected failure
            result["actual_cause"] = str(properties["actual_cause"])
        if "reach" in properties:  # how a user reaches the known deviation
            result["reach"] = str(properties["reach"])
        cause = properties.get("cause")
        if outcome in (Outcome.FAIL, Outcome.ERROR) and isinstance(cause, dict):
            result["cause"] = {str(k): str(v) for k, v in cause.items()}  # jobs.causes.Cause
        measured = properties.get("measured")
        if isinstance(measured, dict) and measured:  # numbers the check measured (parity)
            result["measured"] = measured
        if report.nodeid in self.self_consistency:
            result["self_consistency"] = self.self_consistency[report.nodeid]
        self.results[report.nodeid] = result

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if nodeid in self.check_ids:
            self.write(exit_status=None, complete=False)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # A process that only recorded stopped checks leaves the run as incomplete as it was.
        self.write(exit_status=int(exitstatus), complete=not self.record_only)
        # What the outcomes came from, so that the main job can keep them (harness.jobs.kept).
        record_imports(self.path)

    def write(self, *, exit_status: int | None, complete: bool) -> None:
        target = current_target(self.config)
        if self.identity is None:
            selector = self.config.getoption("--target")
            self.identity = target.identity().as_dict() | {"selector": selector}
        payload = TargetResults(
            schema_version=SCHEMA_VERSION,
            target=self.identity,
            device=self.config.getoption("--device"),
            exit_status=exit_status,
            complete=complete,
            stopped=self.config.stash.get(STOPPED_KEY, ""),
            selected=len(self.check_ids),
            checks=sorted(self.results.values(), key=lambda r: r["id"]),
            stale_deviations=stale_deviations(self.config) if self.check_ids else [],
            build_timings=self.build_timings | dict(target.timings),
            phases=self.phases(dict(target.timings)),
            oracle_answers=add_counts(self.earlier_answers, answered()),
        )
        write_results(self.path, payload)
