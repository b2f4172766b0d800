"""Known deviations: the file format, strict-xfail application, and the committed files."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.deviations import DEVIATIONS_DIR, DeviationFileError, load_deviations
from suites.harness.helpers import ROOT, run_suites

CHECK = "suites/conformance/test_passthrough.py::test_the_upstream_reproducer"


def write(tmp_path, text):
    path = tmp_path / "deviations.toml"
    path.write_text(text)
    return path


def test_load_entries(tmp_path):
    path = write(tmp_path, f'[[deviation]]\ncheck = "{CHECK}"\nreason = "because"\n')
    assert load_deviations(path)[CHECK].reason == "because"


def test_missing_file_means_no_deviations(tmp_path):
    assert load_deviations(tmp_path / "absent.toml") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[deviation]]\ncheck = 'a::b'\n", r"expected the keys \['check', 'reason'\]"),
        ("[[deviation]]\ncheck = 'nope'\nreason = 'r'\n", "check: expected a test id"),
        ("[[deviation]]\ncheck = 'a::b'\nreason = ' '\n", "reason: expected a non-empty string"),
        ("[[deviation]]\ncheck = 'a::b'\nreason = 'r'\n" * 2, "listed twice"),
        ("[other]\nx = 1\n", r"expected only \[\[deviation\]\] tables"),
        ("[[deviation]\n", "not valid TOML"),
    ],
)
def test_malformed_files_name_the_problem(tmp_path, text, message):
    with pytest.raises(DeviationFileError, match=message):
        load_deviations(write(tmp_path, text))


def test_a_deviation_that_now_passes_fails_the_run(tmp_path):
    """Strict: a fix upstream shows up as an unexpected pass, and the run fails."""
    path = write(tmp_path, f'[[deviation]]\ncheck = "{CHECK}"\nreason = "was broken"\n')
    run = run_suites(tmp_path, f"--deviations={path}", "-k", "test_the_upstream_reproducer")
    assert run.returncode == 1
    entry = run.outcome(CHECK)
    assert entry["outcome"] == "xpass"
    assert "was broken" in entry["reason"]


def test_stale_entries_are_reported(tmp_path):
    stale = "suites/conformance/test_passthrough.py::test_renamed_away"
    path = write(tmp_path, f'[[deviation]]\ncheck = "{stale}"\nreason = "r"\n')
    run = run_suites(tmp_path, f"--deviations={path}", "-k", "test_the_upstream_reproducer")
    assert run.returncode == 0
    assert run.results is not None
    assert run.results["stale_deviations"] == [stale]


def test_bad_deviations_file_exits_2(tmp_path):
    path = write(tmp_path, "[[deviation]]\n")
    run = run_suites(tmp_path, f"--deviations={path}", "--co")
    assert run.returncode == 2
    assert "deviation #1" in run.output


@pytest.mark.parametrize("name", ["reference", "vllm"])
def test_committed_deviations_match_existing_checks(name):
    """Every committed entry names a check the suites define (none renamed away)."""
    deviations = load_deviations(DEVIATIONS_DIR / f"{name}.toml")
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "suites/conformance",
            "--co",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert set(deviations) <= set(collected), sorted(set(deviations) - set(collected))
    for deviation in deviations.values():
        assert len(deviation.reason) > 20, f"{deviation.check}: give the reason, not a label"
