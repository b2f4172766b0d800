"""Sharded sweeps (harness.mutation.shards): ``--shard K/N`` deals the kill matrix's mutants and
the mutation sample round-robin; a merge of the N shards is the report an unsharded run writes,
but for how long it took. The kill matrix is proved on real runs of a few corpus mutants; the
score's merge on runs files split as the shards would write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.mutation.shards import Shard, ShardError, check_complete, parse_shard
from suites.harness.helpers import ROOT, needs_vllm


def test_a_shard_takes_every_nth_item_from_its_own():
    items = list(range(7))
    assert [Shard(k, 3).select(items) for k in (1, 2, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert Shard(1, 1).select(items) == items


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_the_shards_of_a_sweep_cover_it_once(count):
    items = list(range(23))
    shards = [Shard(k, count).select(items) for k in range(1, count + 1)]
    assert sorted(i for shard in shards for i in shard) == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("3", "expected K/N (e.g. 2/4), got '3'"),
        ("0/2", "expected 1 <= K <= N, got '0/2'"),
        ("3/2", "expected 1 <= K <= N, got '3/2'"),
        ("1/0", "expected 1 <= K <= N, got '1/0'"),
        ("a/b", "expected K/N"),
    ],
)
def test_a_bad_shard_is_refused_naming_it(text, words):
    with pytest.raises(ShardError, match="--shard: ") as caught:
        parse_shard(text)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("shards", "words"),
    [
        (["1/3", "3/3"], "expected all 3 shards, missing 2/3"),
        (["1/2", "1/2", "2/2"], "shard 1/2 given twice: a and b"),
        (["1/2", "2/3"], "expected shards of one sweep (one N)"),
    ],
)
def test_an_incomplete_set_of_shards_is_refused(shards, words):
    with pytest.raises(ShardError) as caught:
        check_complete(shards, ["a", "b", "c"][: len(shards)])
    assert words in str(caught.value)


# ---------------------------------------------------------------------------------------------
# The kill matrix


MATRIX_MUTANTS = (
    "image-embeds-walrus-truthiness",
    "video-embeds-not-routed",
    "image-embeds-through-the-encoder",
)
MATRIX_SUITES = ("suites/conformance/test_passthrough.py",)


def _timeless(matrix: dict[str, Any]) -> dict[str, Any]:
    from harness.mutation.matrix import WALL_FIELDS

    out = {k: v for k, v in matrix.items() if k not in WALL_FIELDS}
    out["baseline"] = {
        t: {k: v for k, v in b.items() if k != "wall_s"} for t, b in matrix["baseline"].items()
    }
    out["mutants"] = [{k: v for k, v in row.items() if k != "wall_s"} for row in matrix["mutants"]]
    return out


#: ``nemotron-vl-kill-matrix``'s main, once per argument list, in one process: vLLM is imported
#: once for the three sweeps, and each forks its suite runs afresh.
SWEEPS = """
import json, sys
from harness.mutation.matrix import main
for argv in json.loads(sys.argv[1]):
    if main(argv) != 0:
        raise SystemExit(f"exit status not 0 for {argv}")
"""


def _kill_matrices(outs: dict[Path, tuple[str, ...]]) -> list[dict[str, Any]]:
    """``nemotron-vl-kill-matrix`` on the selection into each ``out``, with its own arguments,
    in a process of its own (it forks its suite runs: a test process that built vLLM models
    before must not be their parent)."""
    common = ["--only", *MATRIX_MUTANTS, "--suites", *MATRIX_SUITES]
    argvs = [[*common, "--out", str(out), *args] for out, args in outs.items()]
    done = subprocess.run(
        [sys.executable, "-c", SWEEPS, json.dumps(argvs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900 * len(argvs),
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(out.with_suffix(".json").read_text()) for out in outs]


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_a_merged_kill_matrix_is_the_unsharded_one(tmp_path):
    from harness.mutation.matrix import main

    whole, *parts = _kill_matrices(
        {
            tmp_path / "whole": (),
            tmp_path / "shard-1": ("--shard", "1/2"),
            tmp_path / "shard-2": ("--shard", "2/2"),
        }
    )
    assert [len(p["mutants"]) for p in parts] == [2, 1]
    shard_files = [str(tmp_path / f"shard-{k}.json") for k in (2, 1)]  # any order
    assert main(["--merge", *shard_files, "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert whole["summary"]["killed"] == len(MATRIX_MUTANTS)  # the run proves something
    assert _timeless(merged) == _timeless(whole)
    assert merged["wall_s"] == pytest.approx(sum(p["wall_s"] for p in parts), abs=0.2)


def test_the_kill_matrix_refuses_an_incomplete_merge(tmp_path, capsys):
    from harness.mutation.matrix import main

    shard = tmp_path / "mutants-1.json"
    shard.write_text(json.dumps({"shard": "1/2", "suites": [], "records": [], "baseline": {}}))
    assert main(["--merge", str(shard), "--out", str(tmp_path / "merged")]) == 2
    assert "expected all 2 shards, missing 2/2" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The mutation score


def _write_runs(path: Path, rows: list[dict[str, Any]], header: dict[str, Any] | None) -> None:
    lines = ([header] if header else []) + rows + [{"session_wall_s": 10.0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@needs_vllm
def test_a_merged_mutation_score_is_the_unsharded_one(tmp_path):
    """The sample's mutants with made-up outcomes, written once as an unsharded run's runs file
    and once split as three shards would write them: the merged report equals the unsharded
    one but for the wall time, and the command writes it."""
    from harness.mutation.ast_mutants import candidates, sample
    from harness.mutation.reach import Reach, functions_in_scope, scope_summary
    from harness.mutation.score import _read_runs, build_report, main, merge_runs

    everything = candidates()
    mutants = sample(everything, 7, 3)
    reach = Reach("e" * 64, ["a"], [1.0], {}, {})
    reach_file = tmp_path / "reach.json"
    reach_file.write_text(json.dumps(reach.to_json()))
    scope = scope_summary(reach, functions_in_scope())
    statuses = ("killed", "survived", "killed (timeout)")
    rows = [
        {
            "id": m.id,
            "status": statuses[i % 3],
            "exit": 1,
            "killed_by": [],
            "reason": "",
            "wall_s": 1.0,
        }
        for i, m in enumerate(mutants)
    ]
    _write_runs(tmp_path / "whole.jsonl", rows, None)
    done, wall = _read_runs(tmp_path / "whole.jsonl")
    whole = build_report(
        mutants, done, total_candidates=len(everything), seed=3, wall_s=wall, scope=scope
    )

    paths = []
    for k in (1, 2, 3):
        shard = Shard(k, 3)
        ids = {m.id for m in shard.select(mutants)}
        path = tmp_path / f"runs-{k}.jsonl"
        header = {"shard": str(shard), "sample": 7, "seed": 3, "reach": reach.fingerprint}
        _write_runs(path, [r for r in rows if r["id"] in ids], header)
        paths.append(path)
    merged_runs = merge_runs(paths)
    assert merged_runs.reach == reach.fingerprint
    merged = build_report(
        sample(everything, merged_runs.sample, merged_runs.seed),
        merged_runs.done,
        total_candidates=len(everything),
        seed=merged_runs.seed,
        wall_s=merged_runs.wall_s,
        scope=scope,
    )
    assert merged["wall_s"] == 30.0
    assert {**merged, "wall_s": 0} == {**whole, "wall_s": 0}

    out = ["--out", str(tmp_path / "merged"), "--reach", str(reach_file)]
    assert main(["--merge", *map(str, paths), *out]) == 0
    written = json.loads((tmp_path / "merged.json").read_text())
    assert {**written, "wall_s": 0} == {**whole, "wall_s": 0}

    # A reach map other than the shards' is refused, naming both.
    other = tmp_path / "other-reach.json"
    other.write_text(json.dumps(Reach("d" * 64, ["a"], [1.0], {}, {}).to_json()))
    assert (
        main(["--merge", *map(str, paths), "--out", str(tmp_path / "m2"), "--reach", str(other)])
        == 2
    )

    # Shards of another sweep are refused, naming both.
    header = {"shard": "3/3", "sample": 7, "seed": 3, "reach": "c" * 64}
    _write_runs(paths[2], [], header)
    with pytest.raises(ShardError, match=r"reach map c+; .*different scopes, not one sweep"):
        merge_runs(paths)
    _write_runs(paths[2], [], {"shard": "3/3", "sample": 8, "seed": 3})
    with pytest.raises(ShardError, match=r"sample 8, seed 3.*not one sweep"):
        merge_runs(paths)
    # Shards whose checks ran in the order of another kill history are refused, naming both.
    header = {"shard": "3/3", "sample": 7, "seed": 3, "reach": reach.fingerprint}
    _write_runs(paths[2], [], {**header, "history": "0123456789ab"})
    with pytest.raises(
        ShardError, match=r"kill history 0123456789ab; .*kill history none: .*not one sweep"
    ):
        merge_runs(paths)
