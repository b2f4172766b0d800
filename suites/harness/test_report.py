"""The conformance report: merging runs, exit status, the markdown table, the runner's CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.report import TargetRun, build_report, exit_status, render_markdown
from harness.results import (
    REPORT_SCHEMA,
    RESULTS_SCHEMA,
    SCHEMA_VERSION,
    Outcome,
    ResultsError,
    read_results,
)
from suites.harness.helpers import ROOT, validate


def results(name, *checks):
    document = {
        "schema_version": SCHEMA_VERSION,
        "target": {"name": name, "version": "1", "files": {"f.py": "ab" * 32}},
        "device": "cpu",
        "exit_status": 0,
        "checks": [
            {"id": i, "outcome": o, "reason": r, "runs_on": None, "duration_s": 0.0}
            for i, o, r in checks
        ],
        "stale_deviations": [],
        "build_timings": {},
    }
    validate(document, RESULTS_SCHEMA)
    return document


def report_of(runs):
    report = build_report(runs)
    validate(report, REPORT_SCHEMA)  # every report the tests build
    return report


A = "suites/conformance/test_a.py::test_a"
B = "suites/conformance/test_a.py::test_b"


def test_all_pass_or_known_deviation_is_exit_0():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""), (B, "xfail", "known: why"))),
    ]
    report = report_of(runs)
    assert exit_status(report) == 0
    assert report["checks"][1]["results"]["vllm"]["outcome"] == "xfail"
    md = render_markdown(report)
    assert "| `test_a.py::test_b` | pass | xfail: known: why |" in md
    assert "`vllm`: `f.py` sha256" in md


def test_a_failed_check_is_exit_1():
    runs = [TargetRun("vllm", 1, results("vllm", (A, "fail", "boom"), (B, "xpass", "fixed")))]
    report = report_of(runs)
    assert exit_status(report) == 1
    assert "**FAIL**: boom" in render_markdown(report)


def test_a_target_that_could_not_run_is_exit_2():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""))),
        TargetRun("vllm-file:x.py", 2, None, problem="pytest exited 2 before writing results"),
    ]
    report = report_of(runs)
    assert exit_status(report) == 2
    assert "could not run" in render_markdown(report)


def test_checks_missing_from_a_target_show_a_dash():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""))),
    ]
    assert "| `test_a.py::test_b` | pass | — |" in render_markdown(report_of(runs))


def test_runner_writes_the_report_and_exits_0_on_reference(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.conformance",
            "--target",
            "reference",
            "--out",
            str(tmp_path),
            "--",
            "-k",
            "pass_through_verbatim",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    validate(json.loads((tmp_path / "results-reference.json").read_text()), RESULTS_SCHEMA)
    assert [t["selector"] for t in report["targets"]] == ["reference"]
    assert report["targets"][0]["summary"]["pass"] == 12
    assert (tmp_path / "conformance.md").read_text().startswith("# Nano-Nemotron VL conformance")
    assert (tmp_path / "junit-reference.xml").is_file()


def test_runner_exits_2_when_a_target_cannot_load(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.conformance",
            "--target",
            "reference",
            "--target",
            f"vllm-file:{tmp_path / 'absent.py'}",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout[-3000:]
    report = json.loads((tmp_path / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    assert [t["status"] for t in report["targets"]] == ["ok", "could not run"]


def test_runner_rejects_a_bad_option_with_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.conformance", "--device", "tpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "--device" in proc.stderr


def test_the_schemas_name_the_outcomes_and_version_the_code_writes():
    for path in (RESULTS_SCHEMA, REPORT_SCHEMA):
        schema = json.loads(path.read_text())
        assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}, path.name
    outcomes = json.loads(RESULTS_SCHEMA.read_text())["$defs"]["outcome"]["enum"]
    assert outcomes == [o.value for o in Outcome]
    summary = json.loads(REPORT_SCHEMA.read_text())["$defs"]["target"]["properties"]["summary"]
    assert summary["required"] == [o.value for o in Outcome]


def test_a_report_that_breaks_the_schema_is_caught():
    report = report_of([TargetRun("vllm", 0, results("vllm", (A, "pass", "")))])
    report["targets"][0]["status"] = "fine"
    with pytest.raises(Exception, match="'fine' is not one of"):
        validate(report, REPORT_SCHEMA)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 0}, "schema_version: expected 1, got 0"),
        ({"checks": [{"id": A, "outcome": "passed"}]}, r"checks\[0\].outcome: expected one of"),
        ({"device": None, "build_timings": None}, None),
    ],
    ids=["version", "outcome", "nulls-pass-the-reader"],
)
def test_the_reader_refuses_results_it_cannot_use(tmp_path, change, message):
    document = results("vllm", (A, "pass", "")) | change
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    if message is None:
        assert read_results(path)["checks"][0]["id"] == A
        return
    with pytest.raises(ResultsError, match=message):
        read_results(path)


def test_the_reader_names_missing_fields(tmp_path):
    document = results("vllm")
    del document["checks"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsError, match=r"expected the fields \['checks'\]"):
        read_results(path)
