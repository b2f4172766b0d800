"""A target's outcomes are reused only while nothing they came from changed
(:mod:`harness.jobs.kept`).

The unit tests change one input at a time: a file's content, its time alone, a file of the Python
installation, the options, the environment. The main-job test runs the reference on a few
modules with a plugin of its own as an input: kept, reused with the same outcomes, run again when
the plugin changes, and a failing run is not kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from harness.jobs.kept import (
    DATA_INPUTS,
    KEPT_OUTCOMES_ENV,
    Input,
    KeptOutcomes,
    data_inputs,
    imports_path,
    options_key,
    read_imports,
    record_imports,
)
from harness.jobs.results import REPORT_SCHEMA, SCHEMA_VERSION, TargetResults
from harness.jobs.supervisor import Limits
from suites.harness.helpers import ROOT, one_thread_env, validate

NOT_INSTALLED: tuple[str, ...] = ()  # no file counts as the Python installation's


def results(outcome: str = "pass") -> TargetResults:
    return TargetResults(
        schema_version=SCHEMA_VERSION,
        target={"name": "reference", "version": "0", "selector": "reference"},
        device="cpu",
        exit_status=0,
        complete=True,
        stopped="",
        selected=1,
        checks=[
            {
                "id": "suites/conformance/test_x.py::test_x",
                "outcome": outcome,
                "reason": "",
                "runs_on": None,
                "serving": "default",
                "duration_s": 0.1,
            }
        ],
        stale_deviations=[],
        build_timings={},
    )


def test_an_input_changes_with_its_content_not_with_its_time_alone(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("X = 1\n")
    kept = Input.of(str(source), NOT_INSTALLED)
    assert kept.sha256 is not None
    assert kept.change() is None
    os.utime(source, ns=(1, 1))  # a checkout writes the same bytes again
    assert kept.change() is None
    source.write_text("X = 2\n")  # same size, other bytes
    assert kept.change() == f"{source} changed"
    source.unlink()
    assert kept.change() == f"{source} is gone"


def test_a_file_of_the_python_installation_is_checked_by_size_and_time(tmp_path: Path) -> None:
    source = tmp_path / "site-packages" / "library.py"
    source.parent.mkdir()
    source.write_text("X = 1\n")
    kept = Input.of(str(source), (str(source.parent) + os.sep,))
    assert kept.sha256 is None
    assert kept.change() is None
    os.utime(source, ns=(1, 1))  # reinstalled: the same bytes, but no digest to tell
    assert kept.change() == f"{source} changed"


def test_a_run_is_reused_until_an_input_changes(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("X = 1\n")
    store = KeptOutcomes(tmp_path / "kept")
    options = options_key("reference", "cpu", ["-k", "x"], Limits(), environ={})
    assert store.lookup(options) == (None, "no run of these options is kept")
    store.keep(options, results(), "<testsuites/>", [str(module)], 12.5)
    found, why = store.lookup(options)
    assert why == ""
    assert found is not None
    assert found.results == results()
    assert found.junit == "<testsuites/>"
    assert found.wall_s == 12.5
    assert found.kept_at
    # The harness's data files are inputs too.
    entry = json.loads(next((tmp_path / "kept").glob("*.json")).read_text())
    assert {row[0] for row in entry["inputs"]} == {str(module), *data_inputs()}
    assert any(name.endswith("deviations/vllm.toml") for name in data_inputs())
    assert str(ROOT / "pyproject.toml") in data_inputs()
    assert "pyproject.toml" in DATA_INPUTS
    module.write_text("X = 3\n")
    assert store.lookup(options) == (None, f"{module} changed")


def test_other_options_or_environment_are_another_run(tmp_path: Path) -> None:
    store = KeptOutcomes(tmp_path / "kept")
    base = options_key("vllm", "cpu", [], Limits(), environ={"VLLM_X": "1", "HOME": "/a"})
    store.keep(base, results(), "", [], None)
    assert store.lookup(base)[0] is not None
    # Where the caches live, and variables no library reads, do not matter.
    same = options_key(
        "vllm",
        "cpu",
        [],
        Limits(),
        environ={"VLLM_X": "1", "HOME": "/b", "NEMOTRON_VL_ORACLE_CACHE": "off"},
    )
    assert store.lookup(same)[0] is not None
    for other in (
        options_key("vllm", "cpu", [], Limits(), environ={"VLLM_X": "2"}),
        options_key("vllm", "cpu", [], Limits(), environ={"VLLM_X": "1", "PYTHONHASHSEED": "0"}),
        options_key("vllm", "cpu", ["-k", "lora"], Limits(), environ={"VLLM_X": "1"}),
        options_key("vllm", "cpu", [], Limits(check_timeout_s=10), environ={"VLLM_X": "1"}),
        options_key("vllm-file:/a.py", "cpu", [], Limits(), environ={"VLLM_X": "1"}),
    ):
        assert store.lookup(other) == (None, "no run of these options is kept")


def test_a_torn_or_foreign_entry_is_not_reused(tmp_path: Path) -> None:
    store = KeptOutcomes(tmp_path / "kept")
    options = options_key("reference", "cpu", [], Limits(), environ={})
    path = store.keep(options, results(), "", [], None)
    assert path is not None
    path.write_text(path.read_text()[:100])
    found, why = store.lookup(options)
    assert found is None
    assert why.startswith(f"the kept run {path} cannot be read")
    path.write_text(json.dumps({"version": 0}))
    assert store.lookup(options) == (None, f"the kept run {path} has another layout")


def test_the_environment_names_the_folder_or_turns_reuse_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEPT_OUTCOMES_ENV, str(tmp_path))
    assert KeptOutcomes.from_environment().folder == tmp_path
    monkeypatch.setenv(KEPT_OUTCOMES_ENV, "off")
    store = KeptOutcomes.from_environment()
    assert store.folder is None
    options = options_key("reference", "cpu", [], Limits(), environ={})
    assert store.lookup(options) == (None, "reuse is off")
    assert store.keep(options, results(), "", [], None) is None


def test_a_process_records_the_files_it_imported(tmp_path: Path) -> None:
    results_path = tmp_path / "results-x.json"
    record_imports(results_path)
    files = read_imports([imports_path(results_path)])
    assert files is not None
    assert str(ROOT / "harness" / "jobs" / "kept.py") in files
    assert str(Path(pytest.__file__).resolve()) in files
    assert str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "__init__.py") in files
    # A process that recorded nothing: the run cannot be kept.
    assert read_imports([imports_path(results_path), tmp_path / "missing.imports"]) is None


def test_a_reused_targets_report_shows_no_time_spent_in_this_run() -> None:
    from harness.jobs.report import TargetRun, build_report, render_markdown

    kept = results() | {
        "build_timings": {"v2-static-audio-t1": {"checkpoint_s": 3.0}},
        "phases": {"start_up_s": 5.0, "checks_s": 40.0},
    }
    ran = TargetRun("reference", 0, kept)
    reused = TargetRun("reference", 0, kept, reused={"kept_at": "T", "wall_s": 50.0})
    (fresh,) = build_report([ran])["targets"]
    report = build_report([reused])
    (target,) = report["targets"]
    assert fresh["build_timings"]
    assert fresh["phases"]
    assert fresh["reused"] is None
    assert target["build_timings"] == {}
    assert target["phases"] is None
    assert target["reused"] == {"kept_at": "T", "wall_s": 50.0}
    markdown = render_markdown(report)
    assert "its run that ended at T (50 s), reused" in markdown
    assert "Building the real models" not in markdown
    assert "Where the time went" not in markdown


SELECTION = "test_configs or test_contracts"
PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if {fail!r} and item.name == {fail!r}:
        raise AssertionError("failed by the test's plugin")
"""


def main_job(tmp_path: Path, out: str, *options: str, fail: str = "") -> tuple[dict[str, Any], str]:
    (tmp_path / "plugin_of_the_test.py").write_text(PLUGIN.format(fail=fail))
    env = {
        **one_thread_env(),
        KEPT_OUTCOMES_ENV: str(tmp_path / "kept"),
        "PYTHONPATH": str(tmp_path),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.conformance",
            "--target=reference",
            f"--out={tmp_path / out}",
            *options,
            "--",
            "-p",
            "plugin_of_the_test",
            "-k",
            SELECTION,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == (1 if fail else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads((tmp_path / out / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    return report, proc.stdout


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["results"]["reference"]["outcome"] for c in report["checks"]}


@pytest.mark.slow
def test_the_main_job_reuses_a_clean_run_until_an_input_changes(tmp_path: Path) -> None:
    first, said = main_job(tmp_path, "first", "--groups=2")  # both processes' imports kept
    assert first["targets"][0]["reused"] is None
    assert "reference runs: no run of these options is kept" in said
    assert len(outcomes(first)) >= 20
    assert set(outcomes(first).values()) <= {"pass", "skip"}

    second, said = main_job(tmp_path, "second")
    (target,) = second["targets"]
    assert target["reused"] is not None
    assert target["reused"]["wall_s"] > 0
    assert "reference: reusing the outcomes of its run that ended at" in said
    assert outcomes(second) == outcomes(first)
    assert target["summary"] == first["targets"][0]["summary"]
    assert target["phases"] is None  # no time spent here
    assert (tmp_path / "second" / "junit-reference.xml").read_text().count("<testcase") == len(
        outcomes(first)
    )
    assert "Not run again" in (tmp_path / "second" / "conformance.md").read_text()

    # --rerun runs it, and keeps the new run: the next one reuses that.
    rerun, said = main_job(tmp_path, "rerun", "--rerun")
    assert rerun["targets"][0]["reused"] is None
    assert "reusing" not in said
    assert outcomes(rerun) == outcomes(first)
    again, _ = main_job(tmp_path, "again")
    assert again["targets"][0]["reused"]["kept_at"] >= target["reused"]["kept_at"]
    assert again["targets"][0]["reused"]["wall_s"] == rerun["targets"][0]["wall_s"]

    # The plugin is an input (an imported file): changed, the target runs, and fails.
    failing = next(c for c in outcomes(first) if "test_configs" in c).split("::")[1]
    third, said = main_job(tmp_path, "third", fail=failing)
    assert f"{tmp_path / 'plugin_of_the_test.py'} changed" in said
    assert third["targets"][0]["reused"] is None
    assert "fail" in outcomes(third).values()
    # A failing run is not kept: it runs again.
    fourth, said = main_job(tmp_path, "fourth", fail=failing)
    assert fourth["targets"][0]["reused"] is None
    assert outcomes(fourth) == outcomes(third)


def test_rerun_of_a_target_not_in_the_run_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.jobs.conformance import main

    assert main(["--target", "reference", "--rerun", "vllm", "--out", str(tmp_path)]) == 2
    assert "--rerun: expected targets of this run (reference), got vllm" in capsys.readouterr().err
