"""Record each conformance check's outcome as JSON (``--results-json PATH``) for the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.pytest_deviations import is_check, stale_deviations
from harness.pytest_target import check_path, current_target

# Outcomes as the report names them.
PASS, FAIL, XFAIL, XPASS, SKIP, ERROR = "pass", "fail", "xfail", "xpass", "skip", "error"


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


def classify(report: pytest.TestReport) -> tuple[str, str] | None:
    """The outcome a report decides, with its reason; None when it decides nothing."""
    xfail_reason = getattr(report, "wasxfail", None)
    if report.when == "call":
        if xfail_reason is not None:
            if report.skipped:
                return XFAIL, xfail_reason
            return XPASS, f"unexpected pass of a known deviation: {xfail_reason}"
        if report.passed:
            return PASS, ""
        if report.failed:
            message = _message(report)
            if message.startswith("[XPASS(strict)]"):
                reason = message.removeprefix("[XPASS(strict)]").strip()
                return XPASS, f"unexpected pass of a known deviation: {reason}"
            return FAIL, message
        return SKIP, _message(report)
    if report.failed:
        return ERROR, f"{report.when}: {_message(report)}"
    if report.skipped:
        if xfail_reason is not None:
            return XFAIL, xfail_reason
        return SKIP, _message(report)
    return None


class ResultsRecorder:
    """Collects one outcome per check and writes them when the session ends."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.path = Path(config.getoption("--results-json"))
        self.check_ids: set[str] = set()
        self.runs_on: dict[str, str | None] = {}
        self.results: dict[str, dict[str, Any]] = {}

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
        if previous is not None and previous["outcome"] in (FAIL, ERROR, XPASS):
            return  # a teardown pass never hides a call failure
        outcome, reason = decided
        self.results[report.nodeid] = {
            "id": report.nodeid,
            "outcome": outcome,
            "reason": reason,
            "runs_on": self.runs_on.get(report.nodeid),
            "duration_s": round(report.duration, 4),
        }
        properties = dict(report.user_properties)
        actual = properties.get("actual_cause")
        if actual is not None:  # the exception behind an expected failure
            self.results[report.nodeid]["actual_cause"] = str(actual)
        if "reach" in properties:  # how a user reaches the known deviation
            self.results[report.nodeid]["reach"] = str(properties["reach"])
        measured = properties.get("measured")
        if measured is not None:  # numbers a check measured (parity errors), as recorded
            self.results[report.nodeid]["measured"] = measured

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        target = current_target(self.config)
        payload = {
            "target": target.identity().as_dict() | {"selector": self.config.getoption("--target")},
            "device": self.config.getoption("--device"),
            "exit_status": int(exitstatus),
            "checks": sorted(self.results.values(), key=lambda r: str(r["id"])),
            "stale_deviations": stale_deviations(self.config) if self.check_ids else [],
            "build_timings": dict(target.timings),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(payload, indent=2) + "\n")
