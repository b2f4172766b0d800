"""The regression corpus bites: each upstream fix, put back by its mutant, fails exactly the
checks its record pins, each for its reason (``fixtures/corpus.toml``).

The mutants run from one process: vLLM is imported once, each mutant's suites run in a fork of
it (:mod:`harness.mutation.runner`), two at a time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.model_files import installed_file
from harness.mutation.corpus import (
    CORPUS_FILE,
    CorpusError,
    CorpusMutant,
    corpus_mutants,
    load_corpus,
)
from harness.mutation.file_mutants import MUTATIONS, MutationError, write_mutant
from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_many
from harness.targets.reference.mutant import REFERENCE_MUTANTS
from suites.harness.helpers import needs_vllm

RECORDS = load_corpus()
MUTANTS = corpus_mutants(RECORDS)
TEST_NAME = "test_mutant_fails_exactly_its_pinned_checks"


#: The mutants the default run puts back, one per bug class the corpus began with (a tensor's
#: truth value, an input dropped by routing, a deep copy of a live config through the reference
#: and through vLLM's file); the slow tier runs every one.
DEFAULT_TIER = frozenset(
    {
        "vllm-file:image-embeds-walrus-truthiness",
        "vllm-file:video-embeds-not-routed",
        "reference-mutant:deepcopy-live-config",
    }
)


def _param(mutant: CorpusMutant) -> object:
    marks = [pytest.mark.slow]
    if mutant.key not in DEFAULT_TIER:
        marks.append(pytest.mark.exhaustive)
    if mutant.kind == "vllm-file":
        marks += [pytest.mark.vllm, needs_vllm]
    return pytest.param(mutant, id=mutant.key, marks=marks)


@pytest.fixture(scope="session")
def corpus_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Every selected mutant's run, made once for the session: one vLLM import, forks run two
    at a time."""
    wanted = [
        item.callspec.params["mutant"]
        for item in request.session.items
        if getattr(item, "originalname", None) == TEST_NAME and hasattr(item, "callspec")
    ]
    base = tmp_path_factory.mktemp("corpus")
    jobs = []
    for mutant in wanted:
        workdir = base / mutant.key.replace(":", "-")
        if mutant.kind == "vllm-file":
            target = f"vllm-file:{write_mutant(mutant.name, workdir / 'src')}"
        else:
            target = f"reference-mutant:{mutant.name}"
        jobs.append(SuiteJob(mutant.key, target, mutant.suites, workdir))
    preload(vllm=any(m.kind == "vllm-file" for m in wanted))
    parallel = min(2, os.cpu_count() or 1)
    runs: dict[str, SuiteRun] = {run.key: run for run in run_many(jobs, parallel=parallel)}
    return runs


@pytest.mark.parametrize("mutant", [_param(m) for m in MUTANTS])
def test_mutant_fails_exactly_its_pinned_checks(corpus_runs, mutant):
    run = corpus_runs[mutant.key]
    assert not run.problems, f"{mutant.key}: {run.problems}\n{run.output[-3000:]}"
    assert run.returncode == 1, f"{mutant.key}: exit {run.returncode}\n{run.output[-3000:]}"
    failed = run.outcomes("fail")
    assert failed == set(mutant.fails), (
        f"{mutant.key}: fails checks it should not: {sorted(failed - set(mutant.fails))}; "
        f"passes pinned checks: {sorted(set(mutant.fails) - failed)}"
    )
    for check, reason in mutant.fails.items():
        assert reason in run.outcome(check)["reason"], (check, run.outcome(check)["reason"])
    assert run.outcomes("xpass") == mutant.xpass
    assert run.outcomes("error") == set()


def test_the_default_tiers_mutants_are_in_the_corpus():
    assert {mutant.key for mutant in MUTANTS} >= DEFAULT_TIER


def test_every_mutant_is_in_the_corpus():
    """A mutant without a record is a class nobody pinned; a record naming no mutant pins
    nothing."""
    named = {m.key for m in MUTANTS}
    assert {f"vllm-file:{n}" for n in MUTATIONS} <= named
    assert {f"reference-mutant:{n}" for n in REFERENCE_MUTANTS} <= named
    for mutant in MUTANTS:
        known = MUTATIONS if mutant.kind == "vllm-file" else REFERENCE_MUTANTS
        assert mutant.name in known, f"{mutant.key}: no such mutant"
        for suite in mutant.suites:  # a suite file, or one check of it
            path = suite.split("::")[0]
            assert (CORPUS_FILE.parent.parent / path).is_file(), f"{mutant.key}: {suite}"
        for check in mutant.fails:
            assert any(
                check == s or check.startswith((f"{s}::", f"{s}[")) for s in mutant.suites
            ), f"{mutant.key}: {check} is not in its suites"


@needs_vllm
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_vllm_mutant_applies_to_the_installed_vllm_exactly_once(name, tmp_path):
    """A mutant whose pattern is gone from the installed vLLM fails here: it must be rewritten
    for the new code, never skipped."""
    mutation = MUTATIONS[name]
    installed = installed_file(mutation.file).read_text()
    mutated = write_mutant(name, tmp_path).read_text()  # MutationError unless exactly once
    assert mutated != installed
    compile(mutated, str(mutation.file), "exec")  # still Python


def test_a_mutant_whose_pattern_is_gone_is_refused():
    mutation = MUTATIONS["image-embeds-walrus-truthiness"]
    with pytest.raises(MutationError, match="found it 0 times; the installed vLLM changed"):
        mutation.apply("def nothing_to_mutate(): ...\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected [[record]] tables, found none"),
        ("[[record]]\nid = 'x'\n", "record 'x': field 'upstream' is missing"),
        (
            "[[record]]\nid = 'x'\nupstream = ['#1']\nclass = 'c'\nwhat = 'w'\nfiles = ['f']\n"
            "[[record.mutant]]\nkind = 'vllm'\nname = 'n'\nsuites = ['s']\n"
            "[record.mutant.fails]\n'a::b' = 'r'\n",
            "mutant 0: field 'kind': expected one of ('vllm-file', 'reference-mutant'), got 'vllm'",
        ),
        (
            "[[record]]\nid = 'x'\nupstream = '#1'\n",
            "field 'upstream': expected list, got str '#1'",
        ),
        (
            "[[record]]\nid = 'x'\nupstream = ['#1']\nclass = 'c'\nwhat = 'w'\nfiles = ['f']\n"
            "[[record.mutant]]\nkind = 'vllm-file'\nname = 'n'\nsuites = ['s']\n"
            "[record.mutant.fails]\n'no-separator' = 'r'\n",
            "expected 'suites/...::check' = 'reason substring', got 'no-separator' = 'r'",
        ),
    ],
    ids=["empty", "missing-field", "bad-kind", "wrong-type", "bad-check-id"],
)
def test_a_malformed_corpus_is_named(tmp_path: Path, text, message):
    path = tmp_path / "corpus.toml"
    path.write_text(text)
    with pytest.raises(CorpusError) as caught:
        load_corpus(path)
    assert message in str(caught.value)
