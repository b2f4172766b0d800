"""A target's checks spread over processes (``--groups N``, :mod:`harness.plugin.groups`): whole
modules dealt out evenly, every check in exactly one group, and the merged results the same
checks with the same outcomes as one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from harness.jobs.results import REPORT_SCHEMA, TargetResults, merge_groups
from harness.jobs.supervisor import Supervised, merge_supervised
from harness.plugin.groups import assign_groups, keep_listed, parse_group
from suites.harness.helpers import ROOT, one_thread_env, validate


def test_modules_are_dealt_largest_first_to_the_lightest_group():
    # By hand: a (5) -> 1 (loads 5, 0); b (3) -> 2 (5, 3); c (3) -> 2 (5, 6); d (1) -> 1 (6, 6).
    assert assign_groups({"d": 1, "c": 3, "b": 3, "a": 5}, 2) == {"a": 1, "b": 2, "c": 2, "d": 1}
    assert assign_groups({"a": 1}, 3) == {"a": 1}  # groups 2 and 3 are empty


@pytest.mark.parametrize(
    ("text", "words"),
    [("2", "expected K/N"), ("0/2", "K=0, N=2"), ("3/2", "K=3, N=2"), ("a/b", "expected K/N")],
)
def test_a_bad_group_is_refused_naming_the_option(text, words):
    with pytest.raises(pytest.UsageError, match="--check-group") as raised:
        parse_group(text)
    assert words in str(raised.value)


def results(checks: list[tuple[str, str]], stale: list[str], status: int) -> TargetResults:
    return TargetResults(
        schema_version=1,
        target={"name": "reference"},
        device="cpu",
        exit_status=status,
        complete=True,
        stopped="",
        selected=len(checks),
        checks=[
            {
                "id": c,
                "outcome": o,
                "reason": "",
                "runs_on": None,
                "serving": "default",
                "duration_s": 1.0,
            }
            for c, o in checks
        ],
        stale_deviations=stale,
        build_timings={"v2": {"load": 1.0}},
        phases={"start_up_s": 1.0, "collection_s": 0.5, "checks_s": 2.0},
        oracle_answers={"hits": 3, "misses": 1, "uncached": 0},
    )


def test_groups_merge_into_one_targets_results():
    one = results([("m1::a", "pass"), ("m1::b", "fail")], ["m2::z", "m9::y"], 1)
    two = results([("m2::c", "xfail")], ["m1::x", "m9::y"], 0)
    empty = results([], [], 5)  # pytest: no check collected; it reports no stale entry
    merged = merge_groups([one, two, empty])
    assert [c["id"] for c in merged["checks"]] == ["m1::a", "m1::b", "m2::c"]
    assert merged["selected"] == 3
    assert merged["exit_status"] == 1
    # Only an entry stale in every group that ran checks is stale.
    assert merged["stale_deviations"] == ["m9::y"]
    assert merged["phases"]["checks_s"] == 6.0
    assert merged["oracle_answers"] == {"hits": 9, "misses": 3, "uncached": 0}
    with pytest.raises(ValueError, match="at least one group"):
        merge_groups([])


def test_groups_supervision_merges():
    a = Supervised(
        exit_status=0,
        peak_memory_gib=2.0,
        wall_s=10.0,
        slowest_check=("x", 3.0),
        past_derived_limit=["x: at a.py:1 in f after 31 s, kept the full limit"],
    )
    b = Supervised(
        exit_status=1,
        restarts=1,
        peak_memory_gib=1.5,
        wall_s=12.0,
        slowest_check=("y", 4.0),
        incidents=[{"kind": "timeout", "check": "y", "detail": "", "at_s": 5.0}],
    )
    merged = merge_supervised([a, b])
    assert (merged.exit_status, merged.restarts, merged.wall_s) == (1, 1, 12.0)
    assert merged.peak_memory_gib == 3.5  # the groups run at once
    assert merged.slowest_check == ("y", 4.0)
    assert [i["check"] for i in merged.incidents] == ["y"]
    assert merged.past_derived_limit == a.past_derived_limit


def main_job(out: Path, groups: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.conformance",
            "--target=reference",
            f"--out={out}",
            f"--groups={groups}",
            "--",
            "-k",
            "test_metadata or test_configs or test_contracts",
        ],
        cwd=ROOT,
        env=one_thread_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    return report


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {
        check["id"]: result["outcome"]
        for check in report["checks"]
        for result in check["results"].values()
    }


@pytest.mark.slow
def test_the_same_checks_and_outcomes_in_groups_as_in_one_process(tmp_path):
    alone = main_job(tmp_path / "one", 1)
    grouped = main_job(tmp_path / "three", 3)
    assert len(outcomes(alone)) >= 30
    assert outcomes(grouped) == outcomes(alone)
    (one,), (three,) = alone["targets"], grouped["targets"]
    assert three["summary"] == one["summary"]
    # One JUnit file for the target, as without groups: every group's test cases.
    junit = ElementTree.parse(tmp_path / "three" / "junit-reference.xml").getroot()
    assert len(junit.findall("./testsuite/testcase")) == len(outcomes(alone))
    # Three processes ran, each the whole modules assign_groups gives it for the selection.
    per_module: dict[str, int] = {}
    for check in outcomes(alone):
        module = check.split("::")[0]
        per_module[module] = per_module.get(module, 0) + 1
    group_of = assign_groups(per_module, 3)
    for k in (1, 2, 3):
        assert (tmp_path / "three" / f"junit-reference-group-{k}-of-3.xml").is_file()
        part = json.loads(
            (tmp_path / "three" / f"results-reference-group-{k}-of-3.json").read_text()
        )
        modules = {c["id"].split("::")[0] for c in part["checks"]}
        assert modules == {m for m, g in group_of.items() if g == k}, k
        assert part["selected"] == len(part["checks"]) > 0


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


class _Config:
    """What keep_listed asks of pytest's config: its two options, and the deselection hook."""

    def __init__(self, keep: list[str] | None, drop: list[str] | None) -> None:
        self.options = {"--checks-from": keep, "--checks-not-from": drop}
        self.deselected: list[str] = []
        self.hook = self

    def getoption(self, name: str) -> list[str] | None:
        return self.options[name]

    def pytest_deselected(self, items: list[_Item]) -> None:
        self.deselected += [item.nodeid for item in items]


SELECTABLE = [
    "suites/conformance/test_a.py::test_one[x]",
    "suites/conformance/test_a.py::test_two",
    "suites/conformance/test_b.py::test_three",
    "suites/engine/test_c.py::test_four",
]


@pytest.mark.parametrize(
    ("keep", "drop", "kept"),
    [
        # a check's id, and a module's path for all its checks
        ([["suites/conformance/test_a.py::test_two"]], None, [1]),
        ([["suites/conformance/test_a.py", "suites/engine/test_c.py"]], None, [0, 1, 3]),
        # a check function's id, for all its parameters
        ([["suites/conformance/test_a.py::test_one"]], None, [0]),
        # two files: the checks both list (the gate's stage within its caller's selection)
        (
            [
                ["suites/conformance/test_a.py", "suites/conformance/test_b.py::test_three"],
                ["suites/conformance/test_a.py::test_one[x]", "suites/conformance/test_b.py"],
            ],
            None,
            [0, 2],
        ),
        # kept by one file, dropped by another
        ([["suites/conformance/test_a.py"]], [["suites/conformance/test_a.py::test_one[x]"]], [1]),
        (None, [["suites/conformance"]], [0, 1, 2, 3]),  # a folder is no module path: nothing
    ],
)
def test_checks_are_kept_by_id_or_module_and_by_every_file(tmp_path, keep, drop, kept):
    def files(lists: list[list[str]] | None, name: str) -> list[str] | None:
        if lists is None:
            return None
        paths = []
        for k, lines in enumerate(lists):
            path = tmp_path / f"{name}-{k}.txt"
            path.write_text("".join(f"{line}\n" for line in lines))
            paths.append(str(path))
        return paths

    config = _Config(files(keep, "keep"), files(drop, "drop"))
    items = [_Item(nodeid) for nodeid in SELECTABLE]
    keep_listed(config, items)
    assert [item.nodeid for item in items] == [SELECTABLE[k] for k in kept]
    assert sorted(config.deselected) == sorted(set(SELECTABLE) - {SELECTABLE[k] for k in kept})


def test_a_missing_checks_file_is_refused_naming_the_option(tmp_path):
    config = _Config([str(tmp_path / "absent.txt")], None)
    with pytest.raises(pytest.UsageError, match="--checks-from: expected a file of check ids"):
        keep_listed(config, [_Item(SELECTABLE[0])])
