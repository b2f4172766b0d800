"""The test run keeps its time budget (``fixtures/test_budget.toml``): after its streams, ``nox -s
tests`` (and ``nox -s tests-slow``) runs :func:`test_the_last_test_run_kept_its_budget`, which
reads the JUnit files they wrote and fails naming each stream and module past its share. The
other tests here prove that reading on JUnit files written by hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import ROOT
from harness.machine import cpu_family
from harness.timings import (
    BUDGET_FILE,
    SESSION_ENV,
    BudgetError,
    load_budget,
    module_of,
    overruns,
    read_junit,
    slowest_modules,
    stream_times,
)

REPORTS = ROOT / "reports"

BUDGET = """
[slowdown]
avx512 = 1.0
avx2 = 2.0
[promise]
environments_s = 300
fresh_clone_s = 1800
reused_s = 1200
[session]
tests = ["one"]
[stream.one]
runs = ["a.xml", "b.xml"]
budget_s = 100
default_share_s = 10
[stream.one.shares]
"suites.harness.test_big" = 50
"""


def junit(path: Path, session_s: float, cases: list[tuple[str, float]]) -> None:
    """A JUnit file as pytest writes one (xunit1): its session's time, then its cases."""
    rows = "".join(
        f'<testcase classname="{c}" name="t{i}" time="{s}"/>' for i, (c, s) in enumerate(cases)
    )
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" time="{session_s}">{rows}</testsuite></testsuites>'
    )


@pytest.fixture
def budget_file(tmp_path: Path) -> Path:
    path = tmp_path / "budget.toml"
    path.write_text(BUDGET)
    return path


def test_a_module_past_its_share_is_named_with_its_time_and_share(tmp_path, budget_file):
    # Two cases of one module (11 s) in one file, a listed module within its share in the other.
    junit(tmp_path / "a.xml", 20, [("suites.harness.test_small", 5.5)] * 2)
    junit(tmp_path / "b.xml", 60, [("suites.harness.test_big", 49)])
    found, read = overruns(load_budget(budget_file), tmp_path, "avx512")
    assert read == ["a.xml", "b.xml"]
    assert [str(o) for o in found] == [
        "suites.harness.test_small (stream 'one'): 11 s, past its 10 s"
    ]


def test_the_same_times_on_a_slower_family_are_within_its_shares(tmp_path, budget_file):
    junit(tmp_path / "a.xml", 20, [("suites.harness.test_small", 11)])
    assert overruns(load_budget(budget_file), tmp_path, "avx2")[0] == []


def test_a_stream_past_its_budget_is_named(tmp_path, budget_file):
    # Every module within its share, the session's start-up and collection past the stream's.
    junit(tmp_path / "a.xml", 70, [("suites.harness.test_small", 1)])
    junit(tmp_path / "b.xml", 40, [("suites.harness.test_big", 1)])
    found, _ = overruns(load_budget(budget_file), tmp_path, "avx512")
    assert [str(o) for o in found] == ["stream 'one': 110 s, past its 100 s"]


def test_a_sessions_check_reads_its_own_streams_alone(tmp_path, budget_file):
    # Another session's stream past its share, left by an earlier run: not this session's.
    budget_file.write_text(
        BUDGET.replace('tests = ["one"]', 'tests = ["one"]\nother = ["two"]')
        + '[stream.two]\nruns = ["c.xml"]\nbudget_s = 1\ndefault_share_s = 1\n'
    )
    junit(tmp_path / "c.xml", 50, [("suites.harness.test_small", 50)])
    budget = load_budget(budget_file)
    assert overruns(budget, tmp_path, "avx512", "tests") == ([], [])
    assert len(overruns(budget, tmp_path, "avx512", "other")[0]) == 2
    with pytest.raises(BudgetError, match=r"expected one of \['other', 'tests'\], got 'nox'"):
        overruns(budget, tmp_path, "avx512", "nox")


def test_a_class_of_tests_counts_against_its_module():
    assert (
        module_of("suites.reference.test_audio.TestParityWithVllm") == "suites.reference.test_audio"
    )
    assert module_of("suites.harness.test_gate") == "suites.harness.test_gate"


def test_an_unknown_family_is_refused_naming_the_families(budget_file):
    with pytest.raises(
        BudgetError, match=r"slowdown: expected one of \['avx2', 'avx512'\], got the family 'sse'"
    ):
        load_budget(budget_file).factor("sse")


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "budget_s = 100",
            'budget_s = "100"',
            "stream.one.budget_s: expected a positive number of seconds, got '100'",
        ),
        (
            '"suites.harness.test_big" = 50',
            '"suites.harness.test_big" = -1',
            "stream.one.shares.suites.harness.test_big: expected a positive number",
        ),
        (
            'runs = ["a.xml", "b.xml"]',
            "runs = []",
            "stream.one.runs: expected a list of JUnit file names, got []",
        ),
        (
            'tests = ["one"]',
            'tests = ["two"]',
            "session.tests: expected a list of streams among ['one'], got ['two']",
        ),
        (
            "avx2 = 2.0",
            "avx2 = true",
            "slowdown.avx2: expected a positive number of seconds, got True",
        ),
    ],
)
def test_a_malformed_budget_is_refused_naming_the_field(tmp_path, budget_file, old, new, says):
    budget_file.write_text(BUDGET.replace(old, new))
    with pytest.raises(BudgetError) as raised:
        load_budget(budget_file)
    assert says in str(raised.value)


def test_a_file_that_is_not_junit_is_refused_naming_it(tmp_path):
    (tmp_path / "a.xml").write_text("not xml")
    with pytest.raises(BudgetError, match=r"a\.xml: expected a JUnit XML file"):
        read_junit(tmp_path / "a.xml")


def test_the_committed_budget_keeps_the_promise_on_the_slowest_machine():
    """Each session's slowest stream on the slowest family, its environments built first, within
    the fresh clone's promise (30 minutes), and within the reused one's (20) without them; every
    module's share within its stream's budget."""
    budget = load_budget()
    slowest = max(budget.slowdown, key=budget.slowdown.__getitem__)
    assert slowest == "avx2", budget.slowdown
    tests = budget.session_s("tests", slowest)
    assert tests + budget.environments_s <= budget.fresh_clone_s, (tests, budget.environments_s)
    assert tests <= budget.reused_s, tests
    for stream in budget.streams.values():
        too_big = {m: s for m, s in stream.shares.items() if s > stream.budget_s}
        assert not too_big, (stream.name, too_big)


@pytest.mark.timings
def test_the_last_test_run_kept_its_budget():
    """The JUnit files under ``reports/`` of the run that just ended (``nox -s tests`` runs this
    after its streams): no stream past its budget, no module past its share, scaled to this
    machine's CPU family. The ten slowest modules are printed (``-s``) for the record."""
    budget = load_budget(BUDGET_FILE)
    family = cpu_family()
    session = os.environ.get(SESSION_ENV)  # the session nox just ran; else every stream
    found, read = overruns(budget, REPORTS, family, session)
    if not read:
        pytest.skip("no JUnit file of a test run under reports/: nox -s tests writes them first")
    print(f"\nthis machine: {family} (the budget's times x {budget.factor(family)})")
    for stream, seconds, allowed in stream_times(budget, REPORTS, session):
        print(f"{seconds:8.1f} s  stream {stream!r} (budget {allowed:.0f} s)")
    print("the ten slowest modules:")
    for module, seconds in slowest_modules(REPORTS, read):
        print(f"{seconds:8.1f} s  {module}")
    assert not found, (
        "past the budget (fixtures/test_budget.toml, on "
        + family
        + "): "
        + "; ".join(str(o) for o in found)
    )
