"""The conformance report: merging runs, exit status, the markdown table, the runner's CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from harness.report import TargetRun, build_report, exit_status, render_markdown
from suites.harness.helpers import ROOT


def results(name, *checks):
    return {
        "target": {"name": name, "version": "1", "files": {"f.py": "ab" * 32}},
        "device": "cpu",
        "exit_status": 0,
        "checks": [{"id": i, "outcome": o, "reason": r, "duration_s": 0.0} for i, o, r in checks],
        "stale_deviations": [],
    }


A = "suites/conformance/test_a.py::test_a"
B = "suites/conformance/test_a.py::test_b"


def test_all_pass_or_known_deviation_is_exit_0():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""), (B, "xfail", "known: why"))),
    ]
    report = build_report(runs)
    assert exit_status(report) == 0
    assert report["checks"][1]["results"]["vllm"]["outcome"] == "xfail"
    md = render_markdown(report)
    assert "| `test_a.py::test_b` | pass | xfail: known: why |" in md
    assert "`vllm`: `f.py` sha256" in md


def test_a_failed_check_is_exit_1():
    runs = [TargetRun("vllm", 1, results("vllm", (A, "fail", "boom"), (B, "xpass", "fixed")))]
    report = build_report(runs)
    assert exit_status(report) == 1
    assert "**FAIL**: boom" in render_markdown(report)


def test_a_target_that_could_not_run_is_exit_2():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""))),
        TargetRun("vllm-file:x.py", 2, None, problem="pytest exited 2 before writing results"),
    ]
    report = build_report(runs)
    assert exit_status(report) == 2
    assert "could not run" in render_markdown(report)


def test_checks_missing_from_a_target_show_a_dash():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""))),
    ]
    assert "| `test_a.py::test_b` | pass | — |" in render_markdown(build_report(runs))


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
