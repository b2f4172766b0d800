"""The gate on the model's upstream history (``nemotron-vl-gate-history``): each episode is the
corpus's mutants of one pull request's bugs (read here from ``fixtures/corpus.toml`` itself),
its checkout the files before and after the fix, its verdicts judged against the corpus's
pinned failures; and, slow, the gate run both ways on #56398's file."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness.model_files import installed_file
from harness.mutation.gate_history import HistoryError, checkout, episodes, judge, main
from suites.harness.helpers import ROOT, needs_vllm

CORPUS = tomllib.loads((ROOT / "fixtures" / "corpus.toml").read_text())["record"]


def corpus_mutants(fix: str) -> list[dict[str, Any]]:
    return [
        mutant
        for record in CORPUS
        if fix in record["upstream"]
        for mutant in record["mutant"]
        if mutant["kind"] == "vllm-file"
    ]


def test_an_episode_is_every_vllm_file_mutant_of_its_pull_request():
    (episode,) = episodes(["#56398"])
    wanted = corpus_mutants("#56398")
    assert [m.name for m in episode.mutants] == [m["name"] for m in wanted]
    assert len(wanted) == 3  # truthiness, routing, embeddings through the encoder
    pinned: dict[str, set[str]] = {}
    for mutant in wanted:
        for check, why in mutant["fails"].items():
            pinned.setdefault(check, set()).add(why)
    assert episode.fails == pinned
    # the upstream reproducer meets each of the three bugs: whichever comes first fails it
    every = episode.fails["suites/conformance/test_passthrough.py::test_the_upstream_reproducer"]
    assert len(every) == 3
    # a deviation one bug fixes stays failed where another bug fails it
    routed = next(m for m in wanted if m["name"] == "video-embeds-not-routed")
    assert set(routed["xpass"]) <= set(pinned)
    assert episode.xpass == set()
    assert episode.files == ["vllm/model_executor/models/nano_nemotron_vl.py"]


def test_the_lora_fix_spans_a_file_every_lora_model_shares():
    (episode,) = episodes(["#56231"])
    assert "vllm/lora/peft_helper.py" in episode.files
    assert len(episode.mutants) == len(corpus_mutants("#56231"))
    # a module named whole and one of its checks: the module alone
    assert episode.suites == [
        "suites/conformance/test_lora_adapters.py",
        "suites/conformance/test_lora.py",
    ]


def test_a_record_two_pull_requests_fixed_gives_each_its_own_mutant():
    (first,) = episodes(["#32682"])
    (second,) = episodes(["#40724"])
    assert [m.name for m in first.mutants] == ["static-pixels-without-num-patches"]
    assert [m.name for m in second.mutants] == ["static-pixels-flat-dropped"]


def test_an_unknown_pull_request_is_refused_naming_those_known(capsys):
    with pytest.raises(HistoryError, match=r"--fix: expected a pull request .*#56398.*got '#1'"):
        episodes(["#1"])
    assert main(["--fix", "#1"]) == 2
    assert "got '#1'" in capsys.readouterr().err


@needs_vllm
def test_the_checkout_holds_the_bugs_then_the_installed_files(tmp_path):
    (episode,) = episodes(["#56231"])
    repo, before, after = checkout(episode, tmp_path)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout

    assert git("diff", "--name-only", before, after).split() == episode.files
    for path in episode.files:
        installed = installed_file(Path(path)).read_text()
        assert git("show", f"{after}:{path}") == installed
        assert git("show", f"{before}:{path}") != installed


def document(regressions=(), fixes=(), fixed_deviations=()) -> dict[str, Any]:
    return {
        "regressions": [{"id": c, "head": {"reason": r}} for c, r in regressions],
        "fixes": [{"id": c} for c in fixes],
        "fixed_deviations": [{"id": c} for c in fixed_deviations],
    }


def test_the_bug_is_judged_by_the_pinned_failures_and_their_reasons():
    (episode,) = episodes(["#56398"])
    pinned = [(c, f"... {sorted(why)[0]} ...") for c, why in episode.fails.items()]
    xpass = ["suites/conformance/test_x.py::test_deviation"]  # as if a bug fixed one
    episode = dataclasses.replace(
        episode,
        mutants=(
            dataclasses.replace(episode.mutants[0], xpass=frozenset(xpass)),
            *episode.mutants[1:],
        ),
    )
    assert judge(episode, "bug", document(pinned, fixed_deviations=xpass), whole=False) == ([], [])
    (first, *rest) = pinned
    problems, _ = judge(episode, "bug", document(rest, fixed_deviations=xpass), whole=False)
    assert problems == [f"pinned failure not a regression: {first[0]}"]
    wrong = [(first[0], "another reason"), *rest]
    problems, _ = judge(episode, "bug", document(wrong, fixed_deviations=xpass), whole=False)
    assert len(problems) == 1
    assert problems[0].startswith(f"{first[0]}: expected a reason containing")
    extra = [*pinned, ("suites/conformance/test_x.py::test_y", "boom")]
    problems, _ = judge(episode, "bug", document(extra, fixed_deviations=xpass), whole=False)
    assert problems == ["regression the corpus does not pin: suites/conformance/test_x.py::test_y"]
    # either bug's reason, for a check both pin
    other = [(c, f"... {sorted(why)[-1]} ...") for c, why in episode.fails.items()]
    assert judge(episode, "bug", document(other, fixed_deviations=xpass), whole=False) == ([], [])
    # every conformance check ran: other regressions are listed, not problems
    assert judge(episode, "bug", document(extra, fixed_deviations=xpass), whole=True) == (
        [],
        ["suites/conformance/test_x.py::test_y"],
    )
    problems, _ = judge(episode, "bug", document(pinned), whole=False)
    assert problems == [
        f"known deviation the corpus says the bugs fix, not fixed: {c}" for c in sorted(xpass)
    ]


def test_the_fix_is_judged_by_every_pinned_failure_fixed_and_no_regression():
    (episode,) = episodes(["#56398"])
    fixed = list(episode.fails)
    assert judge(episode, "fix", document(fixes=fixed), whole=False) == ([], [])
    problems, _ = judge(episode, "fix", document(fixes=fixed[1:]), whole=False)
    assert problems == [f"pinned failure not fixed: {fixed[0]}"]
    problems, _ = judge(
        episode, "fix", document([("suites/conformance/a.py::b", "x")], fixed), whole=False
    )
    assert problems == ["regression: suites/conformance/a.py::b"]


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
@pytest.mark.exhaustive
def test_the_gate_gives_the_corpus_verdicts_on_56398_both_ways(tmp_path):
    """The real gate, both directions, on the pre-#56398 file and the installed one: the fix
    exits 0, the bug 1 with exactly the corpus's pinned failures, in groups by cause."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "harness.mutation.gate_history"),
            *("--fix", "#56398", "--out", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    verdicts = {v["direction"]: v for v in json.loads((tmp_path / "history.json").read_text())}
    (episode,) = episodes(["#56398"])
    assert verdicts["fix"]["status"] == 0
    assert verdicts["bug"]["status"] == 1
    assert verdicts["bug"]["counts"]["regressions"] == len(episode.fails)
    groups = verdicts["bug"]["groups"]
    # the truthiness bug's checks fail at the walrus line of the model file itself
    assert any(g["type"] == "RuntimeError" and "nano_nemotron_vl.py" in g["frame"] for g in groups)
    assert sum(g["count"] for g in groups) == len(episode.fails)
    bug_report = (tmp_path / verdicts["bug"]["report"]).read_text()
    assert f"**{len(episode.fails)} regression(s)** (exit status 1)" in bug_report
