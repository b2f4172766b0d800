"""The GPU run's summary page from a hand-written run folder."""

from __future__ import annotations

import json
from pathlib import Path

from harness.gpu import summary as gpu_summary

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="suites.gpu.test_k" name="test_scan[12b-v2-bf16]" time="1.5">
  <properties><property name="measured" value="{'max_relative_error': 0.0071, 'seq0 y': 0.003}"/>
  </properties></testcase>
<testcase classname="suites.gpu.test_k" name="test_conv[omni-fp32-SD]" time="0.5">
  <failure message="AssertionError: errors over 0.005: {...}&#10;more">trace</failure></testcase>
<testcase classname="suites.gpu.test_r" name="test_layer[omni-moe]" time="0.1">
  <skipped message="gpu check: needs a CUDA device and --device cuda"/></testcase>
</testsuite></testsuites>
"""


def run_folder(tmp_path: Path, steps: str) -> Path:
    (tmp_path / "junit-gpu.xml").write_text(JUNIT)
    (tmp_path / "steps.tsv").write_text(steps)
    route = {"loaded": True, "route": "vllm kernel files", "source": "/b/ops"}
    route |= {"package_refused": "import vllm.platforms failed: X", "stand_ins": {"vllm.envs": "Y"}}
    (tmp_path / "kernel-route.json").write_text(json.dumps(route))
    return tmp_path


def test_page_reports_each_check_and_step(tmp_path: Path) -> None:
    page, ok = gpu_summary.summarise(
        run_folder(tmp_path, "gpu-checks\t1\t40\nthroughput\t124\t60\n")
    )
    assert not ok
    assert "## junit-gpu.xml: 1 failed, 1 passed, 1 skipped" in page
    assert "| test_k::test_scan[12b-v2-bf16] | passed | max_relative_error 7.10e-03 |" in page
    assert (
        "- failed: test_k::test_conv[omni-fp32-SD]: AssertionError: errors over 0.005: {...}"
        in page
    )
    assert "- skipped 1: gpu check: needs a CUDA device and --device cuda" in page
    assert "| throughput | 124 (timed out) | 60 |" in page
    assert "- vLLM's package not used: import vllm.platforms failed: X" in page


def test_all_steps_passing_is_ok(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, "gpu-checks\t0\t40\n")
    (folder / "junit-gpu.xml").write_text(
        JUNIT.replace("<failure", "<skipped").replace("</failure>", "</skipped>")
    )
    assert gpu_summary.summarise(folder)[1]


def test_cli_refuses_a_missing_folder(tmp_path: Path) -> None:
    assert gpu_summary.main([str(tmp_path / "absent")]) == 2
