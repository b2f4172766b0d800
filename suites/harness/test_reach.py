"""The reach map: which checks execute which lines, a model build's lines counted for every
check that used the build, and the scope it is measured over."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import coverage
import pytest

from harness.model_files import EVS_FILE, MODEL_FILE, NEMOTRON_H_FILE
from harness.mutation.reach import (
    MEASURING_ENV,
    SCOPE,
    Reach,
    ReachError,
    ScopeFunction,
    attribute_lines,
    fingerprint,
    functions_in_scope,
    line_ranges,
    read_reach,
    scope_summary,
    summary_lines,
)
from harness.mutation.reach_measure import Contexts, clear_caches_of
from suites.harness.helpers import ROOT, needs_vllm

TINY = """\
def build():
    weights = [1, 2]
    return weights


def use(weights):
    return sum(weights)
"""


def load_module(path: Path) -> ModuleType:
    """The module in ``path``, executed (its def lines run outside any check)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_builds_lines_count_for_every_check_that_used_it(tmp_path):
    """Check ``a`` builds the model, check ``b`` finds it built and uses it: under real
    coverage.py, the build's lines (2, 3) count for both, ``use``'s line (7) for ``b`` only."""
    path = tmp_path / "tiny_model.py"
    path.write_text(TINY)
    module = load_module(path)  # before measuring: the def lines are not any check's

    cov = coverage.Coverage(data_file=None, include=[str(path)])
    contexts = Contexts(cov)
    built: dict[str, list[int]] = {}

    def model() -> list[int]:
        def build() -> list[int]:
            if "model" not in built:
                built["model"] = module.build()
            return built["model"]

        return contexts.around_build("model", None, build)

    cov.start()
    try:
        contexts.pytest_runtest_logstart("a")
        model()
        contexts.pytest_runtest_logfinish("a")
        contexts.pytest_runtest_logstart("b")
        module.use(model())
        contexts.pytest_runtest_logfinish("b")
    finally:
        cov.stop()
    by_line = cov.get_data().contexts_by_lineno(str(path))
    got = attribute_lines(by_line, {"a": 0, "b": 1}, contexts.users)
    assert got == {2: [0, 1], 3: [0, 1], 7: [1]}
    assert set(contexts.seconds) == {"a", "b"}


COMPILED = """\
import torch


@torch.compile(backend="eager", dynamic=True)
def scale(x):
    y = x * 2
    return y + 1
"""

COVER_COMPILED = """\
import importlib.util, json, sys
import coverage
import torch

cov = coverage.Coverage(data_file=None, include=[sys.argv[1]])
cov.start()
spec = importlib.util.spec_from_file_location("compiled", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.scale(torch.ones(3))
cov.stop()
print(json.dumps(sorted(cov.get_data().lines(sys.argv[1]))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("measuring", [True, False], ids=["as-measured", "compiled"])
def test_a_compiled_functions_lines_are_seen_only_as_the_map_is_measured(tmp_path, measuring):
    """A function in ``torch.compile`` runs as a traced graph: coverage.py sees its body's lines
    (6 and 7) only under the measuring environment; compiled, the map would call them unreached.
    The control (compiled) proves the premise, so that the measuring setting stays needed."""
    (tmp_path / "compiled.py").write_text(COMPILED)
    (tmp_path / "cover.py").write_text(COVER_COMPILED)
    env = {k: v for k, v in os.environ.items() if k not in MEASURING_ENV}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "cover.py"), str(tmp_path / "compiled.py")],
        env={**env, **MEASURING_ENV} if measuring else env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    body = {6, 7} & set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert body == ({6, 7} if measuring else set())


def test_how_the_map_is_measured_is_part_of_its_fingerprint(monkeypatch):
    before = fingerprint(("suites/conformance/test_metadata.py",))
    monkeypatch.setattr("harness.mutation.reach.METHOD", "another way")
    assert fingerprint(("suites/conformance/test_metadata.py",)) != before


CACHED = """\
import functools


@functools.cache
def window(n):
    return [1.0] * n


class Extractor:
    @staticmethod
    @functools.lru_cache(maxsize=4)
    def filters(n):
        return [0.5] * n
"""


@pytest.mark.parametrize("emptied", [True, False], ids=["caches-emptied", "control"])
def test_a_cached_functions_lines_count_for_every_check_that_calls_it(tmp_path, emptied):
    """Two checks call a module-level ``@cache`` function and a cached static method: their
    bodies (lines 6 and 13) run in both only when the caches are emptied as each check starts;
    the control shows the second check would not be credited."""
    path = tmp_path / "cached_module.py"
    path.write_text(CACHED)
    module = load_module(path)
    sys.modules["cached_module"] = module  # where clear_caches_of finds the loaded modules
    try:
        cov = coverage.Coverage(data_file=None, include=[str(path)])
        contexts = Contexts(cov, clear_caches=lambda: clear_caches_of(["cached_module"]))
        if not emptied:
            contexts.clear_caches = lambda: None
        cov.start()
        try:
            for check in ("a", "b"):
                contexts.pytest_runtest_logstart(check)
                module.window(3)
                module.Extractor.filters(2)
                contexts.pytest_runtest_logfinish(check)
        finally:
            cov.stop()
        assert clear_caches_of(["cached_module"]) == 2
    finally:
        del sys.modules["cached_module"]
    got = attribute_lines(cov.get_data().contexts_by_lineno(str(path)), {"a": 0, "b": 1}, {})
    both_or_first = [0, 1] if emptied else [0]
    assert got == {6: both_or_first, 13: both_or_first}


def test_lines_outside_every_check_have_none():
    assert attribute_lines({5: [""], 6: ["a", "build:0"]}, {"a": 0, "b": 1}, {0: ["b"]}) == {
        6: [0, 1]
    }


def reach() -> Reach:
    return Reach(
        fingerprint="f" * 64,
        checks=["slow", "quick", "mid"],
        seconds=[5.0, 0.1, 1.0],
        lines={"vllm/x.py": {10: [0, 1], 11: [2]}},
        executable={"vllm/x.py": [10, 11, 12, 20]},
    )


def test_a_lines_checks_come_quickest_first():
    assert reach().checks_at(Path("vllm/x.py"), 10, 11) == ["quick", "mid", "slow"]
    assert reach().checks_at(Path("vllm/x.py"), 12) == []
    assert reach().checks_at(Path("vllm/y.py"), 10) == []
    assert reach().seconds_of(["quick", "mid"]) == pytest.approx(1.1)


def test_a_functions_reached_and_unreached_lines():
    function = ScopeFunction(Path("vllm/x.py"), "f", 10, 12)
    assert reach().reached(function) == ([10, 11], [12])


def test_the_map_round_trips_and_a_bad_one_is_named():
    assert Reach.from_json(reach().to_json(), "m.json") == reach()
    with pytest.raises(ReachError, match=r"m\.json: not a reach map \(KeyError"):
        Reach.from_json({"checks": [{"id": "a"}]}, "m.json")


def test_the_summary_lists_what_no_check_reaches():
    functions = [
        ScopeFunction(Path("vllm/x.py"), "f", 10, 12),
        ScopeFunction(Path("vllm/x.py"), "g", 20, 21),
    ]
    scope = scope_summary(reach(), functions)
    assert scope["reached_functions"] == 1
    assert scope["unreached_functions"] == [{"function": "vllm/x.py:g", "lines": [20, 21]}]
    assert scope["partly_reached"] == [{"function": "vllm/x.py:f", "reached": 2, "unreached": [12]}]
    text = "\n".join(summary_lines(scope))
    assert "1 of 2 functions in scope are reached" in text
    assert "- `vllm/x.py:g` (lines 20-21)" in text
    assert "| `vllm/x.py:f` | 1 of 3 | 12 |" in text


@pytest.mark.parametrize(
    ("lines", "text"), [([3, 4, 5, 9], "3-5, 9"), ([1], "1"), ([], ""), ([2, 4], "2, 4")]
)
def test_line_ranges(lines, text):
    assert line_ranges(lines) == text


@needs_vllm
def test_the_scope_is_every_function_of_the_model_files_but_the_lms_serving_path():
    functions = functions_in_scope()
    files = {f.file for f in functions}
    assert files == {entry.file for entry in SCOPE}
    names = {(f.file, f.qualname) for f in functions}
    # Functions the architecture names, one per file family.
    assert (MODEL_FILE, "NemotronH_Nano_VL_V2.load_weights") in names
    assert (MODEL_FILE, "NemotronH_Nano_VL_V2.forward") in names  # the VL model whole
    assert (EVS_FILE, "compute_retention_mask") in names
    assert (NEMOTRON_H_FILE, "NemotronHForCausalLM.load_weights") in names
    assert (NEMOTRON_H_FILE, "NemotronHForCausalLM.forward") not in names
    assert not any(f.file == NEMOTRON_H_FILE and f.qualname.endswith(".forward") for f in functions)
    for function in functions:
        assert function.first_line <= function.last_line, function.name


@needs_vllm
@pytest.mark.slow
def test_the_command_measures_which_checks_execute_which_lines(tmp_path):
    """``nemotron-vl-reach`` on the metadata checks alone, in a process of its own as the score
    runs it: every check of the file is in the map, and the functions those checks exist to
    call (vLLM's limits and per-item token counts) are reached by them."""
    out = tmp_path / "reach.json"
    suite = "suites/conformance/test_metadata.py"
    done = subprocess.run(
        [sys.executable, "-m", "harness.mutation.reach", "--out", str(out), "--suites", suite],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reach = read_reach(out)
    assert reach.checks
    assert all(check.startswith(suite + "::") for check in reach.checks)
    assert reach.fingerprint == fingerprint((suite,)) != fingerprint()
    by_name = {f.qualname: f for f in functions_in_scope() if f.file == MODEL_FILE}
    for name in (
        "NanoNemotronVLProcessingInfo.get_supported_mm_limits",
        "NanoNemotronVLProcessingInfo.get_mm_max_tokens_per_item",
    ):
        reached, _ = reach.reached(by_name[name])
        assert reached, f"{name}: no line reached"
        assert all(reach.checks_at(MODEL_FILE, line) for line in reached)
    assert "functions in scope are reached" in done.stdout


def test_a_multi_line_condition_credits_its_first_line(tmp_path):
    """Python 3.11 runs ``if (\\n a\\n and b\\n):`` on its lower lines; coverage.py names the
    statement by its first line, which must count as reached when the lower ones are."""
    from coverage.python import PythonFileReporter

    from harness.mutation.reach_measure import with_first_lines

    path = tmp_path / "cond.py"
    path.write_text("def f(a, b):\n    if (\n        a\n        and b\n    ):\n        return 1\n")
    reporter = PythonFileReporter(str(path), coverage.Coverage(data_file=None))
    credited = with_first_lines({3: {"check-a"}, 4: {"check-b"}, 6: {"check-a"}}, reporter)
    assert credited == {
        2: {"check-a", "check-b"},
        3: {"check-a"},
        4: {"check-b"},
        6: {"check-a"},
    }
