"""Apply the target's known deviations (``fixtures/deviations/<target>.toml``) as strict xfails
whose cause is pinned: an expected failure with another exception, or a message that does not
match, is a failure naming both causes; the actual cause of every expected failure is recorded
on its report (``user_properties["actual_cause"]``)."""

from __future__ import annotations

import inspect
from collections.abc import Generator
from pathlib import Path
from traceback import format_exception
from types import TracebackType

import pytest

from harness.jobs.deviations import (
    Deviation,
    DeviationFileError,
    describe,
    deviations_path,
    load_deviations,
)
from harness.plugin.target import current_target

DEVIATIONS_KEY = pytest.StashKey[dict[str, Deviation]]()
APPLIED_KEY = pytest.StashKey[set[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nemotron-vl").addoption(
        "--deviations",
        default=None,
        metavar="PATH",
        help="known-deviation file to apply instead of fixtures/deviations/<target>.toml",
    )


def pytest_configure(config: pytest.Config) -> None:
    option = config.getoption("--deviations")
    path = Path(option) if option else deviations_path(current_target(config).deviations_name)
    if option and not path.is_file():
        pytest.exit(f"harness could not run: --deviations: {path}: no such file", returncode=2)
    try:
        config.stash[DEVIATIONS_KEY] = load_deviations(path)
    except DeviationFileError as e:
        pytest.exit(f"harness could not run: {e}", returncode=2)
    config.stash[APPLIED_KEY] = set()


@pytest.fixture(scope="session")
def pinned_deviations(pytestconfig: pytest.Config) -> list[Deviation]:
    """The target's known deviations, as applied to its checks (``fixtures/deviations/`` by the
    target's ``deviations_name``, so a ``vllm-file:`` target's are vLLM's, or ``--deviations``):
    a failure one of them explains (its exception and message, or the bound it exceeds) is that
    deviation's, pinned where a catalogued check reaches it, not a new problem."""
    return list(pytestconfig.stash[DEVIATIONS_KEY].values())


def is_check(item: pytest.Item) -> bool:
    """A conformance check is a test that runs against the target."""
    return "target" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deviations = config.stash[DEVIATIONS_KEY]
    applied = config.stash[APPLIED_KEY]
    for item in items:
        deviation = deviations.get(item.nodeid)
        if deviation is not None and is_check(item):
            item.add_marker(pytest.mark.xfail(reason=deviation.reason, strict=True))
            _report_failures_natively(item)
            applied.add(item.nodeid)


def _report_failures_natively(item: pytest.Item) -> None:
    """An expected failure's traceback in Python's own form, from the check's frame on, not in
    pytest's long form.

    The long form parses every file of the traceback again for each failure (vLLM's model file
    among them): 0.16 s per expected failure, a fifth of vLLM's suite run, for a traceback the
    xfail throws away. Python's form reads the same lines through linecache; a deviation
    that failed for another reason shows it (below)."""
    function = getattr(item, "obj", None)
    check_code = getattr(inspect.unwrap(function), "__code__", None) if function else None

    def repr_failure(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
        start: TracebackType | None = excinfo.tb
        while start is not None and start.tb_frame.f_code is not check_code:
            start = start.tb_next
        return "".join(format_exception(excinfo.type, excinfo.value, start or excinfo.tb))

    # An instance attribute shadows the class's method for this item alone (pytest calls
    # item.repr_failure(excinfo) to build a failed call's report).
    item.__dict__["repr_failure"] = repr_failure


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """After the xfail marker has turned a failure into an expected one, check its cause."""
    report = yield
    deviation = item.config.stash[DEVIATIONS_KEY].get(item.nodeid)
    if deviation is None or call.when != "call" or call.excinfo is None:
        return report
    exc = call.excinfo.value
    if not getattr(report, "wasxfail", None):
        return report
    report.user_properties.append(("actual_cause", describe(exc)))
    report.user_properties.append(("reach", deviation.reach))
    different = deviation.cause_of(exc)
    if different is not None:
        del report.wasxfail  # set by pytest's skipping plugin
        report.outcome = "failed"
        # The cause is the failure's one line (the summary's, the report's reason); where the
        # check failed follows it, as a section of the failure's output.
        report.sections.append(("the check's traceback", str(report.longrepr)))
        report.longrepr = f"known deviation failed for another reason: {different}"
    return report


def stale_deviations(config: pytest.Config) -> list[str]:
    """Entries that matched no collected check (renamed or removed checks)."""
    listed: dict[str, Deviation] = config.stash[DEVIATIONS_KEY]
    applied: set[str] = config.stash[APPLIED_KEY]
    return sorted(set(listed) - applied)
