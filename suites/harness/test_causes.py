"""Failures grouped by cause (:mod:`harness.jobs.causes`): the frame a failure is charged to, the
groups and their order, the known deviation a group is the cause of, and the cause the results
plugin records for a failed check. Expected frames are the lines written here, found by
reading this file's own source (not by the code under test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from harness.jobs.causes import (
    UNRECORDED,
    CauseGroup,
    cause_of,
    current_cause,
    group_by_cause,
    known_cause,
)
from harness.jobs.deviations import Deviation
from suites.harness.helpers import ROOT

HERE = Path(__file__)
VLLM_SOURCE = textwrap.dedent(
    """\
    def helper(n):
        return embed(n)


    def embed(n):
        raise TypeError(f"int() argument must be a real number, not {n!r}")
    """
)


def _module(name: str, source: str) -> types.ModuleType:
    """A module of ``name`` (as ``vllm-file:`` loads a changed file under vLLM's module name)."""
    module = types.ModuleType(name)
    module.__file__ = f"/elsewhere/{name.replace('.', '/')}.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _line_of(text: str, path: Path = HERE) -> int:
    """The line of ``path`` that holds ``text`` (exactly once)."""
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def test_a_failure_is_charged_to_the_innermost_frame_of_vllms_code():
    vllm_module = _module("vllm.model_executor.models.toy", VLLM_SOURCE)
    harness_module = _module("harness.targets.toy", "def run(f):\n    return f(None)\n")
    try:
        harness_module.run(vllm_module.helper)  # the check -> harness -> vLLM -> vLLM
    except TypeError:
        cause = current_cause(HERE, ROOT)
    raise_line = VLLM_SOURCE.splitlines().index(
        '    raise TypeError(f"int() argument must be a real number, not {n!r}")'
    )
    assert cause == {
        "type": "TypeError",
        "frame": f"vllm/model_executor/models/toy.py:{raise_line + 1} (embed)",
        "message": "int() argument must be a real number, not None",
    }


def test_without_vllm_on_the_traceback_it_is_the_checks_failed_assertion():
    def compare(a: int, b: int) -> None:
        assert a == b, f"expected {b}, got {a}"  # <- charged here

    try:
        compare(1, 2)
    except AssertionError as e:
        cause = cause_of(AssertionError, e, e.__traceback__, HERE, ROOT)
    line = _line_of("# <- " + "charged here")
    test = "test_without_vllm_on_the_traceback_it_is_the_checks_failed_assertion"
    assert cause["frame"] == f"suites/harness/test_causes.py:{line} ({test}.<locals>.compare)"
    assert cause["type"] == "AssertionError"
    assert cause["message"].startswith("expected 2, got 1")


def test_an_exception_type_outside_builtins_keeps_its_module():
    error = json.JSONDecodeError("Expecting value", "x", 0)
    cause = cause_of(type(error), error, None, HERE, ROOT)
    assert cause["type"] == "json.decoder.JSONDecodeError"
    assert cause["frame"] == "(no frame)"


def _check(check_id: str, type_: str | None, frame: str = "", message: str = "m") -> dict:
    check: dict = {"id": check_id, "outcome": "fail", "reason": f"{message}\nmore"}
    if type_ is not None:
        check["cause"] = {"type": type_, "frame": frame, "message": message}
    return check


def test_checks_of_one_type_and_frame_form_one_group_the_largest_first():
    frame = "vllm/model_executor/models/nano_nemotron_vl.py:10 (f)"
    checks = [
        _check("a", "TypeError", frame, "first"),
        _check("b", "ValueError", frame),  # same frame, another type
        _check("c", "TypeError", frame, "second"),
        _check("d", "TypeError", "vllm/multimodal/parse.py:5 (g)"),
        _check("e", "TypeError", frame, "third"),
        _check("f", None, message="timed out after 300 s"),
        _check("g", None, message="timed out after 300 s"),
    ]
    groups = group_by_cause(checks)
    assert [(g.type, g.frame, g.ids) for g in groups] == [
        ("TypeError", frame, ["a", "c", "e"]),
        (UNRECORDED, "timed out after 300 s", ["f", "g"]),
        ("ValueError", frame, ["b"]),
        ("TypeError", "vllm/multimodal/parse.py:5 (g)", ["d"]),
    ]
    assert groups[0].message == "first"


def _deviation(check: str, raises: str, match: str) -> Deviation:
    return Deviation(check, "the processor calls int(None)", raises, match, "request")


def test_a_group_whose_exception_a_deviation_pins_elsewhere_says_so():
    group = CauseGroup("TypeError", "vllm/x.py:1 (f)", "int() argument must be ... not 'NoneType'")
    group.ids = ["suites/a.py::test_new"]
    deviations = {
        "suites/a.py::test_other": _deviation("suites/a.py::test_other", "TypeError", r"int\(\)"),
        "suites/a.py::test_value": _deviation("suites/a.py::test_value", "ValueError", r"int\(\)"),
    }
    known = known_cause(group, deviations)
    assert known is not None
    assert known.startswith("`suites/a.py::test_other`: the processor calls int(None)")
    # The group's own check's entry is no news; another type or message is not this cause.
    group.ids = ["suites/a.py::test_other"]
    assert known_cause(group, deviations) is None
    other = CauseGroup("TypeError", "vllm/x.py:1 (f)", "unhashable type: 'list'", ["x"])
    assert known_cause(other, deviations) is None


def test_the_results_plugin_records_a_failed_checks_cause(tmp_path):
    """A check module failing its own assertion and one failing in a module named as vLLM's,
    run by pytest with the harness's plugin (checks are tests that take the ``target``): each
    recorded cause names its frame."""
    check_file = tmp_path / "test_toy.py"
    check_file.write_text(
        textwrap.dedent(
            """\
            import types

            def test_assertion(target):
                assert 1 == 2, "one is not two"

            def test_in_vllm(target):
                module = types.ModuleType("vllm.toy")
                exec(compile("def f():\\n    raise KeyError('k')\\n", "toy.py", "exec"),
                     module.__dict__)
                module.f()

            def test_passes(target):
                pass

            def test_pinned_for_another_cause(target):
                module = types.ModuleType("vllm.toy")
                exec(compile("def g():\\n    raise ValueError('v')\\n", "toy.py", "exec"),
                     module.__dict__)
                module.g()
            """
        )
    )
    (tmp_path / "conftest.py").write_text("")
    # A known deviation pinning another exception: the check fails for another reason, and its
    # cause is the exception it raised (the gate groups it with that exception's others).
    deviations = tmp_path / "deviations.toml"
    deviations.write_text(
        textwrap.dedent(
            f"""\
            [[deviation]]
            check = "{check_file.name}::test_pinned_for_another_cause"
            reason = "pinned to a TypeError"
            raises = "TypeError"
            match = "t"
            reach = "request"
            """
        )
    )
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "harness.plugin",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            str(check_file),
            f"--results-json={results}",
            f"--rootdir={tmp_path}",
            f"--deviations={deviations}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if not results.is_file():
        pytest.fail(proc.stdout[-3000:] + proc.stderr[-3000:])
    checks = {c["id"].split("::")[-1]: c for c in json.loads(results.read_text())["checks"]}
    assert checks["test_assertion"]["cause"]["type"] == "AssertionError"
    assert checks["test_assertion"]["cause"]["frame"].endswith(
        f"test_toy.py:{_line_of('assert 1 == 2', check_file)} (test_assertion)"
    )
    assert checks["test_in_vllm"]["cause"] == {
        "type": "KeyError",
        "frame": "vllm/toy.py:2 (f)",
        "message": "'k'",
    }
    assert "cause" not in checks["test_passes"]
    pinned = checks["test_pinned_for_another_cause"]
    assert pinned["outcome"] == "fail"
    assert pinned["reason"].startswith("known deviation failed for another reason")
    assert pinned["cause"] == {"type": "ValueError", "frame": "vllm/toy.py:2 (g)", "message": "v"}
