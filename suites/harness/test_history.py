"""The order a mutant's checks run in (harness.mutation.history): the checks that killed its
neighbours in the last sweep first, its own record left out, the history fixed for a sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.mutation import score
from harness.mutation.ast_mutants import enumerate_mutants
from harness.mutation.history import HistoryError, KillHistory
from suites.harness.helpers import needs_vllm

FILE = Path("vllm/example.py")
SOURCE = "def f(a):\n    b = a + 1\n    return b * 2\n\n\ndef g(a):\n    return a - 1\n"


def mutant_at(line: int, function: str = "f") -> Any:
    return next(m for m in enumerate_mutants(SOURCE, FILE, function).mutants if m.line == line)


def row(mutant_id: str, line: int, killed_by: list[str], function: str = "f") -> dict[str, Any]:
    return {
        "id": mutant_id,
        "file": str(FILE),
        "function": function,
        "line": line,
        "status": "killed" if killed_by else "survived",
        "killed_by": killed_by,
    }


#: The checks a mutant of line 2 reaches, the quickest first.
QUICKEST_FIRST = ["quick", "often-elsewhere", "in-function", "on-line", "slow"]


def test_the_checks_that_killed_neighbours_run_first():
    """By hand: `on-line` killed one other mutant of line 2; `in-function` killed two of f's
    line 3; `often-elsewhere` killed three of g; `quick` and `slow` killed nothing. Same line
    first, then same function, then anywhere, and the quickest first among equals."""
    history = KillHistory.from_report(
        {
            "mutants": [
                row("other-on-line-2", 2, ["on-line"]),
                row("f-3-a", 3, ["in-function"]),
                row("f-3-b", 3, ["in-function"]),
                *(row(f"g-{i}", 7, ["often-elsewhere"], "g") for i in range(3)),
                row("a-survivor", 2, []),
            ]
        }
    )
    assert history.order(mutant_at(2), QUICKEST_FIRST) == [
        "on-line",
        "in-function",
        "often-elsewhere",
        "quick",
        "slow",
    ]
    # A mutant of g's line 7 has no kills of its own line but three in its function.
    assert history.order(mutant_at(7, "g"), QUICKEST_FIRST)[0] == "often-elsewhere"


def test_a_mutants_own_record_is_left_out():
    """The mutant killed by `slow` last time: ordered as one never run, `slow` is not moved up
    for it, while for its neighbour on the same line it is."""
    mutant = mutant_at(2)
    history = KillHistory.from_report({"mutants": [row(mutant.id, 2, ["slow"])]})
    assert history.order(mutant, QUICKEST_FIRST) == QUICKEST_FIRST
    neighbour = [m for m in enumerate_mutants(SOURCE, FILE, "f").mutants if m.line == 2][1]
    assert history.order(neighbour, QUICKEST_FIRST)[0] == "slow"


def test_no_history_keeps_the_quickest_first():
    assert KillHistory().order(mutant_at(2), QUICKEST_FIRST) == QUICKEST_FIRST
    assert KillHistory().digest == ""
    assert KillHistory.read(Path("/nonexistent/mutation.json")).kills == ()


def test_a_recheck_kill_counts_and_the_history_round_trips():
    recheck = {"status": "killed", "killed_by": ["on-line"]}
    history = KillHistory.from_report({"mutants": [{**row("survivor", 2, []), "recheck": recheck}]})
    assert history.order(mutant_at(2), QUICKEST_FIRST)[0] == "on-line"
    again = KillHistory.from_json(json.loads(json.dumps(history.to_json())), "runs")
    assert again == history
    assert len(history.digest) == 12


@pytest.mark.parametrize(
    ("report", "words"),
    [
        ({"mutants": {}}, "report: mutants: expected a list of mutant rows, got dict"),
        ({"mutants": [7]}, r"report: mutants\[0\]: expected an object, got int"),
        (
            {"mutants": [{**row("m", 2, ["c"]), "line": "2"}]},
            r"report: mutants\[0\].line: expected int, got '2'",
        ),
    ],
)
def test_a_malformed_report_is_refused_naming_the_field(report, words):
    with pytest.raises(HistoryError, match=words):
        KillHistory.from_report(report)


def test_a_tampered_runs_file_history_is_refused():
    document = KillHistory.from_report({"mutants": [row("m", 2, ["c"])]}).to_json()
    with pytest.raises(HistoryError, match=r"runs: history.digest: expected [0-9a-f]{12}"):
        KillHistory.from_json({**document, "digest": "0" * 12}, "runs")
    with pytest.raises(HistoryError, match=r"runs: history.kills: expected a list"):
        KillHistory.from_json({"kills": [["m", "f"]], "digest": ""}, "runs")


@needs_vllm
def test_a_resumed_sweep_keeps_the_history_it_began_with(tmp_path, monkeypatch, capsys):
    """The runs file's history, not the --history file changed since, orders and is reported;
    a malformed --history file is refused naming it."""
    from harness.mutation.reach import Reach

    reach_file = tmp_path / "reach.json"
    reach_file.write_text(json.dumps(Reach("e" * 64, ["a"], [1.0], {}, {}).to_json()))
    began = KillHistory.from_report({"mutants": [row("m", 2, ["began"])]})
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"history": began.to_json()}) + "\n")
    monkeypatch.setattr(score, "RUNS_FILE", runs)
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps({"mutants": [row("m", 2, ["changed"])]}))
    out = tmp_path / "report"
    common = ["--report-only", "--sample", "3", "--reach", str(reach_file), "--out", str(out)]
    assert score.main([*common, "--history", str(changed)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["history"] == began.digest
    assert began.digest in out.with_suffix(".md").read_text()

    runs.unlink()
    changed.write_text("{not json")
    assert score.main([*common, "--history", str(changed)]) == 2
    assert (
        f"error: --history: {changed}: cannot read the mutation report" in capsys.readouterr().err
    )
