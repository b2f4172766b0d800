"""Record each conformance check's outcome as JSON (``--results-json PATH``) for the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.pytest_deviations import is_check, stale_deviations
from harness.pytest_target import check_path, current_target
from harness.results import SCHEMA_VERSION, CheckResult, Outcome, TargetResults


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nemotron-vl").addoption(
        "--results-json",
        default=None,
        metavar="PATH",
        help="write each conformance check's outcome and the target's identity to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--results-json"):
        config.pluginmanager.register(ResultsRecorder(config), "nemotron-vl-results")


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
        self.results: dict[str, CheckResult] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.check_ids = {item.nodeid for item in items if is_check(item)}
        self.runs_on = {item.nodeid: check_path(item) for item in items if is_check(item)}

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
            duration_s=round(report.duration, 4),
        )
        properties = dict(report.user_properties)
        if "actual_cause" in properties:  # the exception behind an expected failure
            result["actual_cause"] = str(properties["actual_cause"])
        if "reach" in properties:  # how a user reaches the known deviation
            result["reach"] = str(properties["reach"])
        measured = properties.get("measured")
        if isinstance(measured, dict) and measured:  # numbers the check measured (parity)
            result["measured"] = measured
        self.results[report.nodeid] = result

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        target = current_target(self.config)
        payload = TargetResults(
            schema_version=SCHEMA_VERSION,
            target=target.identity().as_dict() | {"selector": self.config.getoption("--target")},
            device=self.config.getoption("--device"),
            exit_status=int(exitstatus),
            checks=sorted(self.results.values(), key=lambda r: r["id"]),
            stale_deviations=stale_deviations(self.config) if self.check_ids else [],
            build_timings=dict(target.timings),
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(payload, indent=2) + "\n")
