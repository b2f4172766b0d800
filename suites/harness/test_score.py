"""The mutation score's bookkeeping: a mutant no check reaches is a survivor without a run, its
run's checks and time limit come from the reach map, and the score counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.mutation import score
from harness.mutation.ast_mutants import enumerate_mutants
from harness.mutation.reach import Reach

FILE = Path("vllm/example.py")
SOURCE = "def f(a):\n    b = a + 1\n    return b * 2\n"


def mutants():
    return enumerate_mutants(SOURCE, FILE, "f").mutants


def reach_of(lines: dict[int, list[int]]) -> Reach:
    return Reach("f" * 64, ["slow", "quick"], [20.0, 2.0], {str(FILE): lines}, {str(FILE): [2, 3]})


def test_a_mutant_no_check_reaches_survives_without_a_run(tmp_path, monkeypatch):
    def no_runs(**_: object) -> None:
        raise AssertionError("nothing is reached: nothing must run")

    monkeypatch.setattr(score, "preload", no_runs)
    done: dict[str, dict[str, object]] = {}
    runs = tmp_path / "runs.jsonl"
    score._run_sample(mutants(), done, 1, tmp_path, reach_of({}), runs_file=runs)
    assert len(done) == len(mutants())
    assert all(row["unreached"] and row["status"] == "survived" for row in done.values())
    assert [json.loads(line)["id"] for line in runs.read_text().splitlines()] == [
        m.id for m in mutants()
    ]


def test_a_mutants_checks_and_time_limit_come_from_the_map():
    reach = reach_of({2: [0, 1]})
    line_2 = [m for m in mutants() if m.line == 2]
    line_3 = [m for m in mutants() if m.line == 3]
    assert line_2
    assert line_3
    assert all(score.checks_of(reach, m) == ["quick", "slow"] for m in line_2)
    assert all(score.checks_of(reach, m) == [] for m in line_3)
    # 60 s for a fresh process's set-up and 3 x the checks' 22 s.
    assert score.run_limit(reach, ["quick", "slow"]) == pytest.approx(60 + 3 * 22)
    assert score.run_limit(reach_of({}), []) == 60
    # No cap below an honest run: checks measured at 1000 s get 3060 s, not a fixed 300.
    long = Reach("f" * 64, ["c"], [1000.0], {}, {})
    assert score.run_limit(long, ["c"]) == pytest.approx(60 + 3 * 1000)


def test_unreached_mutants_count_as_survivors_in_the_score():
    """Four mutants: two killed, one survivor that ran (unclassified), one unreached: the score
    is 2 / 4, and the report says which is which."""
    chosen = mutants()[:4]
    assert len(chosen) == 4
    rows = {
        chosen[0].id: {"id": chosen[0].id, "status": "killed", "wall_s": 2.0, "checks": 3},
        chosen[1].id: {"id": chosen[1].id, "status": "killed", "wall_s": 4.0, "checks": 1},
        chosen[2].id: {"id": chosen[2].id, "status": "survived", "wall_s": 6.0, "checks": 5},
        chosen[3].id: score._unreached_row(chosen[3]),
    }
    report = score.build_report(
        chosen, rows, total_candidates=9, seed=0, wall_s=12.0, scope={"files": []}
    )
    assert (report["done"], report["run"], report["unreached"]) == (4, 3, 1)
    assert report["score"] == 0.5
    assert report["unclassified_survivors"] == 1
    assert report["mean_run_wall_s"] == 4.0
    assert report["mean_checks_per_run"] == 3.0
    verdicts = [r.get("classification", {}).get("verdict") for r in report["mutants"]]
    assert verdicts == [None, None, "unclassified", "unreached"]


def report_of(rows: list[dict[str, object]], *, sampled: int, seed: int = 0) -> dict[str, object]:
    return {"seed": seed, "sampled": sampled, "wall_s": 30.0, "mutants": rows}


def test_going_on_from_a_report_runs_only_what_the_new_map_could_change():
    """Line 2 is reached by one check in the new map, line 3 still by none: of five mutants,
    the killed one and the survivor that ran that one check keep their results (the survivor
    its recheck), the unreached one on line 2 runs, the one on line 3 stays unreached, and a
    survivor that ran against no check of those the map now gives (0 < 1) runs again."""
    line_2 = [m for m in mutants() if m.line == 2]
    line_3 = [m for m in mutants() if m.line == 3]
    chosen = [line_2[0], line_2[1], line_2[2], line_3[0], line_2[3]]
    recheck = {"status": "survived", "killed_by": [], "reason": ""}
    rows: list[dict[str, object]] = [
        {"id": chosen[0].id, "status": "killed", "killed_by": ["c"], "checks": 0, "wall_s": 3.0},
        {"id": chosen[1].id, "status": "survived", "checks": 1, "recheck": recheck},
        {**score._unreached_row(chosen[2]), "function": "f", "classification": {}},
        score._unreached_row(chosen[3]),
        {"id": chosen[4].id, "status": "survived", "checks": 0},
    ]
    runs, again = score.runs_from_report(
        report_of(rows, sampled=5), chosen, reach_of({2: [1]}), sample_size=5, seed=0
    )
    assert again == [chosen[2].id, chosen[4].id]
    assert list(runs) == [chosen[0].id, chosen[1].id, chosen[3].id]
    assert runs[chosen[0].id] == rows[0]
    assert runs[chosen[1].id]["recheck"] == recheck
    assert runs[chosen[3].id]["unreached"] is True
    assert "function" not in runs[chosen[3].id]  # a report's own fields are not a run's


@pytest.mark.parametrize(
    ("report", "words"),
    [
        (report_of([], sampled=4, seed=1), "the report's seed is 1, expected 0"),
        (report_of([], sampled=5), "the report's sampled is 5, expected 4"),
        (
            report_of([{"id": "models/other:g:1:0:constant:0", "status": "killed"}], sampled=4),
            "mutant 'models/other:g:1:0:constant:0' is not in this sample",
        ),
    ],
)
def test_a_report_of_another_sample_is_refused_naming_what_differs(report, words):
    with pytest.raises(ValueError, match="--from-report") as raised:
        score.runs_from_report(report, mutants()[:4], reach_of({}), sample_size=4, seed=0)
    assert words in str(raised.value)


class Ran(Exception):
    """Raised where a run would start."""


def test_a_survivor_classified_against_the_installed_files_is_not_run_again(tmp_path, monkeypatch):
    """Of two mutants of line 2 classified equivalent, the one classified against the files
    installed now is recorded without a run (counted by its verdict, apart from the runs); the
    one classified against other files runs."""
    monkeypatch.setattr(score, "classified_against", lambda: "vllm 9.9, scope files abc")

    def no_runs(**_: object) -> None:
        raise Ran

    monkeypatch.setattr(score, "preload", no_runs)
    monkeypatch.setattr(score, "write_mutant_file", lambda mutant, folder: folder / "m.py")
    first, second = [m for m in mutants() if m.line == 2][:2]
    now = score.Classification("equivalent", "cannot change", "vllm 9.9, scope files abc")
    before = score.Classification("equivalent", "cannot change", "vllm 9.8, scope files def")
    done: dict[str, dict[str, object]] = {}
    runs = tmp_path / "runs.jsonl"
    reach = reach_of({2: [0, 1]})
    score._run_sample([first], done, 1, tmp_path, reach, runs_file=runs, classified={first.id: now})
    row = done[first.id]
    assert (row["status"], row["classified_unchanged"], row["wall_s"]) == ("survived", True, 0.0)
    assert "vllm 9.9, scope files abc, which is installed: not run again" in str(row["reason"])
    assert json.loads(runs.read_text())["id"] == first.id
    with pytest.raises(Ran):
        score._run_sample(
            [second], done, 1, tmp_path, reach, runs_file=runs, classified={second.id: before}
        )

    monkeypatch.setattr(score, "load_survivors", lambda: {first.id: now})
    report = score.build_report(
        [first], done, total_candidates=1, seed=0, wall_s=1.0, scope={"files": []}
    )
    assert (report["run"], report["classified_not_run"], report["equivalent"]) == (0, 1, 1)


def test_a_malformed_classified_against_is_named(tmp_path):
    path = tmp_path / "survivors.toml"
    path.write_text(
        '[[survivor]]\nid = "m"\nverdict = "equivalent"\nreason = "r"\nclassified_against = 3\n'
    )
    with pytest.raises(score.SurvivorFileError, match="survivor 0: field 'classified_against'"):
        score.load_survivors(path)
