"""The pull-request gate on a small vLLM checkout made at test time: the installed vLLM's model
file on a base commit, and a changed commit (a seeded bug, a fixed known deviation, an unrelated
file, a file that needs a newer vLLM, a shared file, the LoRA scaling both legs see). Each run
is narrowed with ``-k`` to the checks of the change's class (the engine leg then runs only where
``-k`` picks engine checks), so that it takes seconds to minutes, not a full run per side.
The gate runs the tests read are made once each, two at a time (:func:`gate_runs`)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.jobs.runtimes import engine_python
from harness.jobs.speed import git_commit as commit
from harness.jobs.speed import installed_checkout as make_checkout
from harness.model_files import MODEL_FILE, NEMOTRON_H_FILE, installed_file
from harness.mutation.file_mutants import MUTATIONS
from harness.mutation.scope_engine import cpu_build_package
from suites.harness.helpers import ROOT, needs_vllm, one_thread_env, selected_tests, two_at_a_time

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm]
#: The engine leg's tests: they need the CPU build's environment.
needs_engine_environment = pytest.mark.skipif(
    engine_python() is None,
    reason="no environment with vLLM's CPU build (.nox/engine, built by nox): the engine leg "
    "cannot run",
)

PASSTHROUGH = "suites/conformance/test_passthrough.py::"


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    return make_checkout(tmp_path)


def run_gate(repo: Path, base: str, head: str | None, out: Path, *pytest_args: str):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.gate",
            "--repo",
            str(repo),
            "--base",
            base,
            *(["--head", head] if head else []),
            "--out",
            str(out),
            "--no-cache",
            *(["--", *pytest_args] if pytest_args else []),
        ],
        cwd=ROOT,
        env=one_thread_env(),  # two gates run at once (below)
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    report = json.loads((out / "gate.json").read_text()) if (out / "gate.json").is_file() else None
    return proc, report


#: The head revision (None: the working tree), the pytest selection, and the base revision when
#: the change makes its own (None: the checkout's first commit).
Change = tuple[str | None, tuple[str, ...], str | None]
#: A file vLLM shares with every model, which this model's checks run (the gate's scope).
SHARED_FILE = "vllm/utils/tensor_schema.py"
#: A conformance check that builds NemotronH's layers (without running its forward), and the
#: engine's check of the language model's forward on a text prompt.
LORA_LAYER_CHECK = "adds_its_tokens_delta[q_proj]"
ENGINE_TEXT_CHECK = "test_prompt_logprobs_match_the_reference[text]"


def seed_a_bug(repo: Path) -> Change:
    model = repo / MODEL_FILE
    model.write_text(MUTATIONS["image-embeds-walrus-truthiness"].apply(model.read_text()))
    return commit(repo, "check image_embeds by truth value"), ("-k", "pass_through_verbatim"), None


def fix_a_known_deviation(repo: Path) -> Change:
    """Ragged image embeddings: declaring the row dimension dynamic fixes the known deviation
    (uncommitted: the head is the working tree)."""
    model = repo / MODEL_FILE
    source = model.read_text()
    declared = (
        '    data: Annotated[torch.Tensor | list[torch.Tensor], TensorShape("n", "f", "h")]\n'
    )
    image_class = source.index("class NanoNemotronVLImageEmbeddingInputs")
    at = source.index(declared, image_class)
    fixed = declared.replace('"h")', '"h", dynamic_dims={"f"})')
    model.write_text(source[:at] + fixed + source[at + len(declared) :])
    return None, ("-k", "ragged_embedding_lists"), None


def use_a_newer_helper(repo: Path) -> Change:
    model = repo / MODEL_FILE
    model.write_text(
        "from vllm.model_executor.models.utils import a_helper_from_the_future\n"
        + model.read_text()
    )
    return commit(repo, "use a newer helper"), ("-k", "pass_through_verbatim"), None


def one_line_changed(
    repo: Path, path: str, released: str, old: str, new: str, message: str
) -> tuple[str, str]:
    """``path`` committed as ``released``, then with its one line holding ``old`` changed to
    ``new``: the two revisions."""
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(released)
    base = commit(repo, f"{path}, as released")
    assert released.count(old) == 1, f"the released {path} changed: pick another line"
    file.write_text(released.replace(old, new))
    return base, commit(repo, message)


def break_a_shared_file(repo: Path) -> Change:
    """vLLM's tensor schema, shared by every model, asks a field for its truth value instead of
    comparing it with None: the model's embeddings (tensors) fail validation."""
    base, head = one_line_changed(
        repo,
        SHARED_FILE,
        installed_file(Path(SHARED_FILE)).read_text(),
        "if not hasattr(self, field_name) or getattr(self, field_name) is None:",
        "if not hasattr(self, field_name) or not getattr(self, field_name):",
        "tensor schema: a missing field by its truth value",
    )
    return head, ("-k", "pass_through_verbatim"), base


def break_the_language_models_activation(repo: Path) -> Change:
    """NemotronH's MLP takes ReLU instead of the configured squared ReLU: the language model's
    forward, which only the engine leg runs (the conformance suites stop at the multimodal
    embeddings), answers off the reference."""
    old = "        self.act_fn = get_act_fn(hidden_act)\n"
    base, head = one_line_changed(
        repo,
        NEMOTRON_H_FILE.as_posix(),
        installed_file(NEMOTRON_H_FILE).read_text(),
        old,
        old.replace("hidden_act", '"relu"'),
        "NemotronH: the MLP's activation by its default name",
    )
    return head, ("-k", f"{LORA_LAYER_CHECK} or {ENGINE_TEXT_CHECK}"), base


#: A file only vLLM's engine runs (its sampler, in the worker's process), which the conformance
#: checks never execute: the engine leg's scope alone holds it.
ENGINE_ONLY_FILE = "vllm/v1/sample/sampler.py"


def break_the_engines_log_probabilities(repo: Path) -> Change:
    """The sampler normalises the logits over the positions instead of the vocabulary: every
    prompt log-probability the engine returns is wrong. The file is the CPU build's (the engine
    leg's vLLM), committed as released first."""
    python = engine_python()
    assert python is not None
    package, _ = cpu_build_package(str(python))
    old = "return logits.log_softmax(dim=-1, dtype=torch.float32)"
    base, head = one_line_changed(
        repo,
        ENGINE_ONLY_FILE,
        (package.parent / ENGINE_ONLY_FILE).read_text(),
        old,
        old.replace("dim=-1", "dim=0"),
        "sampler: log-probabilities over the first dimension",
    )
    return head, ("-k", ENGINE_TEXT_CHECK), base


#: The changes whose gate runs take a while, by the test that reads the run.
CHANGES: dict[str, Callable[[Path], Change]] = {
    "test_a_seeded_bug_is_a_regression_with_its_rerun_command": seed_a_bug,
    "test_a_fixed_known_deviation_is_good_news": fix_a_known_deviation,
    "test_a_file_that_needs_a_newer_vllm_exits_2_saying_so": use_a_newer_helper,
    "test_a_shared_file_the_checks_run_is_gated_and_grouped": break_a_shared_file,
    "test_the_engine_leg_judges_the_change_where_users_serve_it": (
        break_the_language_models_activation
    ),
    "test_a_file_only_the_engine_runs_is_gated_by_the_engine_leg_alone": (
        break_the_engines_log_probabilities
    ),
}


@dataclass
class GateRun:
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any] | None
    out: Path


@pytest.fixture(scope="module")
def gate_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, GateRun]:
    """The gate on each selected test's change, each on its own checkout, made once for the
    module, two at a time."""
    wanted = [item.originalname for item in selected_tests(request) if item.originalname in CHANGES]

    def run(test: str) -> GateRun:
        folder = tmp_path_factory.mktemp(test.removeprefix("test_")[:40])
        repo, base = make_checkout(folder)
        head, selection, own_base = CHANGES[test](repo)
        proc, report = run_gate(repo, own_base or base, head, folder / "out", *selection)
        return GateRun(proc, report, folder / "out")

    return two_at_a_time(run, wanted)


def test_a_seeded_bug_is_a_regression_with_its_rerun_command(gate_runs):
    run = gate_runs["test_a_seeded_bug_is_a_regression_with_its_rerun_command"]
    proc, report = run.proc, run.report
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    regressions = {r["id"]: r for r in report["regressions"]}
    assert set(regressions) == {
        f"{PASSTHROUGH}test_embeddings_pass_through_verbatim[{n}-stacked-image_embeds]"
        for n in (1, 2, 5)
    }
    for entry in regressions.values():
        assert entry["base"] == "pass"
        assert "Boolean value of Tensor" in entry["head"]["reason"]
        words = shlex.split(entry["rerun"])
        assert words[:4] == ["python", "-m", "pytest", entry["id"]], words
        assert words[4] == f"--target=vllm-file:{run.out / 'head' / 'src' / MODEL_FILE}"
    assert report["fixed_deviations"] == []
    # One cause: the truth value of a tensor, asked on the seeded (walrus) line of the model file.
    (group,) = report["groups"]
    assert (group["type"], group["count"], sorted(group["ids"])) == (
        "RuntimeError",
        3,
        sorted(regressions),
    )
    head_file = run.out / "head" / "src" / MODEL_FILE
    path, _, where = group["frame"].partition(":")
    assert path == MODEL_FILE.as_posix(), group["frame"]
    line = int(where.split(" ")[0])
    assert ":=" in head_file.read_text().splitlines()[line - 1], group["frame"]
    assert "Boolean value of Tensor" in group["message"]
    rerun = shlex.split(group["rerun"])
    assert rerun[:3] == ["python", "-m", "pytest"]
    ids_file = Path(rerun[3].removeprefix("@"))
    assert ids_file.read_text().split() == group["ids"]
    markdown = (run.out / "gate.md").read_text()
    assert "**3 regression(s)** (exit status 1)" in markdown
    assert "## Regressions (3) in 1 group(s) by cause" in markdown
    assert f"### 1. 3 checks: `RuntimeError` from `{group['frame']}`" in markdown
    assert "Unchanged: 9 checks (9 pass)." in markdown


@pytest.mark.exhaustive
def test_a_fixed_known_deviation_is_good_news(gate_runs):
    run = gate_runs["test_a_fixed_known_deviation_is_good_news"]
    proc, report = run.proc, run.report
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["head"] == "working tree"
    assert [e["id"] for e in report["fixed_deviations"]] == [
        f"{PASSTHROUGH}test_ragged_embedding_lists_pass_through[image_embeds]"
    ]
    assert report["regressions"] == []
    markdown = (run.out / "gate.md").read_text()
    assert "delete their entries from `fixtures/deviations/vllm.toml`" in markdown


def test_an_unrelated_change_exits_0_without_running(checkout, tmp_path):
    repo, base = checkout
    (repo / "README.md").write_text("changed\n")
    head = commit(repo, "docs")
    proc, report = run_gate(repo, base, head, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "touches none of the files this model's checks run: `README.md`" in proc.stdout
    assert report == {
        "repo": str(repo),
        "base": base,
        "head": head,
        "touched": [],
        "changed": ["README.md"],
        "exit_status": 0,
    }
    markdown = (tmp_path / "out" / "gate.md").read_text()
    assert "touches none of the files this model's checks run" in markdown
    assert "fixtures/gate_scope.json" in markdown


@pytest.mark.exhaustive
def test_a_file_that_needs_a_newer_vllm_exits_2_saying_so(gate_runs):
    run = gate_runs["test_a_file_that_needs_a_newer_vllm_exits_2_saying_so"]
    proc, report = run.proc, run.report
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["sides"]["head"]["status"] == "could not run"
    assert (
        "lacks 'a_helper_from_the_future (from vllm.model_executor.models.utils)'"
        in report["sides"]["head"]["problem"]
    )
    assert "this file needs a newer or different vLLM" in report["sides"]["head"]["problem"]
    # Nothing to compare a head that cannot run with: the base side is not run.
    assert report["sides"]["base"]["problem"] == "not run: the head side could not run"
    assert not (run.out / "base" / "conformance.json").exists()


def test_a_bad_revision_exits_2_naming_it(checkout, tmp_path):
    repo, _ = checkout
    proc, report = run_gate(repo, "no-such-rev", None, tmp_path / "out")
    assert proc.returncode == 2
    assert "no-such-rev" in proc.stderr
    assert report is None


@pytest.mark.exhaustive
def test_a_shared_file_the_checks_run_is_gated_and_grouped(gate_runs):
    """A change to a file outside the model's seven, which the scope table says the checks run:
    gated, its functions' checks first, its regressions in one group charged to its line."""
    run = gate_runs["test_a_shared_file_the_checks_run_is_gated_and_grouped"]
    proc, report = run.proc, run.report
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["touched"] == [SHARED_FILE]
    assert report["stages"][0] == f"changed functions: {SHARED_FILE}: TensorSchema.validate"
    assert report["stages"][1].startswith("stage 1: ")
    assert report["stages"][2] == "stage 2: no other check selected"  # -k kept stage 1's alone
    head_file = run.out / "head" / "src" / SHARED_FILE
    changed_line = next(
        i
        for i, line in enumerate(head_file.read_text().splitlines(), 1)
        if "or not getattr(self, field_name):" in line
    )
    (largest, *_) = report["groups"]
    assert largest["type"] == "RuntimeError"
    assert largest["frame"] == f"{SHARED_FILE}:{changed_line} (TensorSchema.validate)"
    assert "Boolean value of Tensor" in largest["message"]
    assert largest["count"] == len(report["regressions"])


@needs_engine_environment
def test_the_engine_leg_judges_the_change_where_users_serve_it(gate_runs):
    """The engine leg runs the change's files in vLLM's engine on the CPU build: a bug in the
    language model's forward, which the conformance leg cannot see, is its regression, grouped
    apart and rerun in the engine's environment."""
    run = gate_runs["test_the_engine_leg_judges_the_change_where_users_serve_it"]
    proc, report = run.proc, run.report
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["touched"] == [NEMOTRON_H_FILE.as_posix()]
    assert report["regressions"] == []  # the conformance leg: no forward of the language model
    assert report["sides"]["head"]["status"] == "ok"
    engine = report["engine"]
    assert engine["ran"], engine["notes"]
    assert engine["sides"]["head"]["selector"].startswith("vllm-engine-file:")
    (regression,) = engine["regressions"]
    assert regression["id"] == f"suites/engine/test_forward.py::{ENGINE_TEXT_CHECK}"
    assert regression["base"] == "pass"
    assert "log-probability" in regression["head"]["reason"]
    assert "above the bound" in regression["head"]["reason"]
    assert shlex.split(regression["rerun"])[0] == str(engine_python())
    (group,) = engine["groups"]
    assert (group["type"], group["count"]) == ("AssertionError", 1)
    assert group["frame"].startswith("suites/engine/test_forward.py:")
    assert shlex.split(group["rerun"])[0] == str(engine_python())
    markdown = (run.out / "gate.md").read_text()
    assert "**1 regression(s)** (exit status 1)" in markdown
    _, engine_part = markdown.split("## The engine leg: vLLM's engine and server on its CPU build")
    assert "### Regressions (1) in 1 group(s) by cause" in engine_part


@needs_engine_environment
@pytest.mark.exhaustive
def test_a_file_only_the_engine_runs_is_gated_by_the_engine_leg_alone(gate_runs):
    """A change to vLLM's sampler, which the engine leg's measured scope holds and the
    conformance checks never run: gated, the conformance leg left out saying why, the engine
    leg's text check a regression (its prompt log-probabilities normalised over positions)."""
    run = gate_runs["test_a_file_only_the_engine_runs_is_gated_by_the_engine_leg_alone"]
    proc, report = run.proc, run.report
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["touched"] == [ENGINE_ONLY_FILE]
    assert report["stages"][0].startswith("not run: the change touches only files the engine")
    assert report["sides"] == {}
    assert report["regressions"] == []
    engine = report["engine"]
    assert engine["ran"], engine["notes"]
    (regression,) = engine["regressions"]
    assert regression["id"] == f"suites/engine/test_forward.py::{ENGINE_TEXT_CHECK}"
    assert regression["base"] == "pass"
    assert "log-probability" in regression["head"]["reason"]
    markdown = (run.out / "gate.md").read_text()
    assert f"`{ENGINE_ONLY_FILE}` (" in markdown
    assert "run by vLLM's engine under" in markdown
