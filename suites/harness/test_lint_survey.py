"""Every finding of the lint on the installed vllm, torch and transformers has a reviewed
verdict (``fixtures/lint/survey_verdicts.toml``), and the committed survey report shows exactly
those verdicts: a change to the lint that adds an unreviewed finding, loses a reviewed one, or a
verdict that flips, fails here until the fixture and ``nox -s lint-survey`` are redone."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from no_tensor_truthiness.survey import REVIEWED_TREES, package_dir, reviewed_findings

ROOT = Path(__file__).resolve().parents[2]
SURVEY = ROOT / "reports" / "lint-survey.json"

pytestmark = [
    pytest.mark.skipif(
        package_dir("vllm") is None, reason="the survey reviews the installed vLLM (extra `vllm`)"
    ),
    pytest.mark.slow,  # the review lints vLLM, torch and transformers whole: 42 s on 2 cores
]


@pytest.fixture(scope="module")
def review():
    trees = {name: path for name in REVIEWED_TREES if (path := package_dir(name)) is not None}
    return reviewed_findings(trees)


def versions_note(review) -> str:
    if review["reviewed_on"] == review["installed"]:
        return ""
    return f" (reviewed on {review['reviewed_on']}, installed {review['installed']})"


def test_every_finding_has_a_verdict(review):
    unreviewed = [f["finding"] for f in review["findings"] if f["verdict"] == "unreviewed"]
    assert unreviewed == [], (
        f"findings without a verdict{versions_note(review)}: add each to "
        f"fixtures/lint/survey_verdicts.toml with its reason: {unreviewed}"
    )


def test_every_verdict_still_has_its_finding(review):
    stale = [(s["path"], s["code"], s["source"], s["verdict"]) for s in review["stale_verdicts"]]
    assert stale == [], f"verdicts whose finding is gone{versions_note(review)}: {stale}"


def test_the_committed_survey_shows_these_verdicts(review):
    committed = json.loads(SURVEY.read_text())["review"]

    def verdicts(rows):
        return Counter((r["path"], r["code"], r["source"], r["verdict"]) for r in rows)

    assert verdicts(committed["findings"]) == verdicts(review["findings"]), (
        "reports/lint-survey.json is out of date: run `nox -s lint-survey`"
    )
    assert committed["precision"] == review["precision"]


def test_findings_made_by_a_wrong_annotation_say_which_annotation(review):
    wrong = [f for f in review["findings"] if f["verdict"] == "annotation wrong"]
    assert wrong, "the survey has no wrong-annotation finding: this test checks nothing"
    for f in wrong:
        assert "annotated `" in f["finding"], f["finding"]
        assert "correct the annotation" in f["finding"], f["finding"]


def test_the_reviewed_trees_are_the_installed_ones(review):
    """The verdicts are facts about these versions (vLLM and torch are pinned by the `vllm`
    extra); another transformers may add or remove findings, which the tests above report."""
    assert review["reviewed_on"]["vllm"] == review["installed"]["vllm"]
    assert review["reviewed_on"]["torch"] == review["installed"]["torch"]
