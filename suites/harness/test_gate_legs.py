"""The gate's two legs without running a suite: the engine leg's decisions (run, or left out
saying why), the exit status over both legs, and the delta report's engine section with rerun
commands in the engine's environment. Sides are built from hand-written results documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.jobs import gate_sides as gate
from harness.jobs.causes import known_cause
from harness.jobs.deviations import deviations_path, load_deviations
from harness.jobs.gate_report import ENGINE_LEG_TITLE, Leg, Side, compare, render
from harness.jobs.report import TargetRun
from harness.jobs.results import SCHEMA_VERSION

ENGINE_CHECK = "suites/engine/test_forward.py::test_prompt_logprobs_match_the_reference[images-pil]"
#: A check whose known deviation (fixtures/deviations/vllm-engine.toml) pins an EngineError
#: from the image-embeddings processor bug.
PINNED = ENGINE_CHECK.replace("[images-pil]", "[image-embeds-stacked]")
CONFORMANCE_CHECK = "suites/conformance/test_routing.py::test_nothing_is_silently_dropped[core]"
FILES = [Path("/tmp/side/src/vllm/model_executor/models/nano_nemotron_vl.py")]


def results(*checks: tuple[str, str, dict[str, str] | None]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "target": {"name": "vllm-engine-file", "version": "1", "files": {}},
        "device": "cpu",
        "exit_status": 1 if any(o == "fail" for _, o, _ in checks) else 0,
        "complete": True,
        "stopped": "",
        "selected": len(checks),
        "checks": [
            {
                "id": check,
                "outcome": outcome,
                "reason": cause["message"] if cause else "",
                "runs_on": "engine",
                "serving": "default",
                "duration_s": 0.0,
                **({"cause": cause} if cause else {}),
            }
            for check, outcome, cause in checks
        ],
        "stale_deviations": [],
        "build_timings": {},
    }


def side(
    name: str, document: dict[str, Any] | None, problem: str = "", engine: bool = True
) -> Side:
    selector = ("vllm-engine-file:" if engine else "vllm-file:") + str(FILES[0])
    exit_status = 2 if document is None else int(document["exit_status"])
    return Side(name, "rev", FILES, TargetRun(selector, exit_status, document, problem), 1.0)


#: An engine core that died on the head: the processor's int(None), as the pinned deviation's.
ENGINE_ERROR = {
    "type": "EngineError",
    "frame": "suites/engine/conftest.py:120 (answer)",
    "message": "EngineError: the engine core died\n<- TypeError: int() argument must be a "
    "string, a bytes-like object or a real number, not 'NoneType'",
}


def test_an_engine_regression_is_grouped_against_the_engines_known_deviations(tmp_path):
    base = side("base", results((ENGINE_CHECK, "pass", None), (PINNED, "xfail", None)))
    head = side("head", results((ENGINE_CHECK, "fail", ENGINE_ERROR), (PINNED, "xfail", None)))
    leg, notes = gate.engine_leg(lambda: (base, head), tmp_path)
    assert leg is not None, notes
    assert [r["id"] for r in leg.delta.regressions] == [ENGINE_CHECK]
    ((group, ids_file),) = leg.groups
    assert group.type == "EngineError"
    assert group.ids == [ENGINE_CHECK]
    # the engine's deviation file names this cause (an engine check's entry); the vllm
    # target's file, whose entries pin the TypeError itself, does not
    assert group.known is not None
    assert "[image-embeds-stacked]`" in group.known
    assert "int(None)" in group.known
    assert known_cause(group, load_deviations(deviations_path("vllm"))) is None
    assert ids_file == tmp_path / "regressions-engine" / "1.txt"
    assert ids_file.read_text() == ENGINE_CHECK + "\n"
    assert leg.deviations_name == "vllm-engine"


def test_files_the_cpu_build_cannot_load_leave_the_leg_out_saying_so(tmp_path):
    problem = (
        "vllm-file: the installed vLLM lacks 'a_helper (from vllm.model_executor.models.utils)' "
        "(ImportError); this file needs a newer or different vLLM"
    )
    head = side("head", None, problem)
    base = side("base", None, "not run: the head side could not run")
    leg, notes = gate.engine_leg(lambda: (base, head), tmp_path)
    assert leg is None
    (note,) = notes
    assert note.startswith("not run: the head's files do not load on the CPU build")
    assert "a_helper" in note


def test_a_head_that_cannot_run_for_another_reason_is_a_leg_that_could_not_run(tmp_path):
    head = side("head", None, "pytest exited 3 (the harness could not run this target)")
    base = side("base", None, "not run: the head side could not run")
    leg, _ = gate.engine_leg(lambda: (base, head), tmp_path)
    assert leg is not None
    conformance = conformance_leg(pass_to="pass")
    assert gate.gate_status(conformance, leg) == 2


def test_a_selection_without_engine_checks_leaves_the_leg_out(tmp_path):
    empty = results()
    empty["selected"] = 0
    leg, notes = gate.engine_leg(
        lambda: (side("base", None, "not run: the head side could not run"), side("head", empty)),
        tmp_path,
    )
    assert leg is None
    assert notes == ["not run: the pytest arguments select no engine or server check"]


def conformance_leg(pass_to: str) -> Leg:
    base = side("base", results((CONFORMANCE_CHECK, "pass", None)), engine=False)
    cause = {"type": "AssertionError", "frame": "x.py:1 (f)", "message": "AssertionError: no"}
    head_check = (CONFORMANCE_CHECK, pass_to, cause if pass_to == "fail" else None)
    head = side("head", results(head_check), engine=False)
    return Leg(base, head, compare(base.outcomes, head.outcomes), [])


@pytest.mark.parametrize(
    ("conformance_head", "engine_head", "status"),
    [("pass", "pass", 0), ("fail", "pass", 1), ("pass", "fail", 1), ("fail", "fail", 1)],
)
def test_the_exit_status_counts_both_legs(tmp_path, conformance_head, engine_head, status):
    base = side("base", results((ENGINE_CHECK, "pass", None)))
    cause = ENGINE_ERROR if engine_head == "fail" else None
    head = side("head", results((ENGINE_CHECK, engine_head, cause)))
    engine, _ = gate.engine_leg(lambda: (base, head), tmp_path)
    assert engine is not None
    assert gate.gate_status(conformance_leg(conformance_head), engine) == status


def test_the_report_has_the_engine_leg_with_its_own_rerun_commands(tmp_path, monkeypatch):
    engine_python = tmp_path / "engine" / "bin" / "python"
    monkeypatch.setattr("harness.jobs.gate_report.engine_python", lambda: engine_python)
    base = side("base", results((ENGINE_CHECK, "pass", None)))
    head = side("head", results((ENGINE_CHECK, "fail", ENGINE_ERROR)))
    engine, notes = gate.engine_leg(lambda: (base, head), tmp_path)
    assert engine is not None
    conformance = conformance_leg("pass")
    markdown = render(Path("/repo"), ["f.py"], conformance, 1, None, [], engine, notes)
    _, engine_part = markdown.split(f"## {ENGINE_LEG_TITLE}")
    assert "1 regression(s)" in markdown.splitlines()[2]
    assert "### Regressions (1) in 1 group(s) by cause" in engine_part
    assert "#### 1. 1 check: `EngineError`" in engine_part
    assert f"`{engine_python} -m pytest @{tmp_path}/regressions-engine/1.txt" in engine_part
    assert f"--target=vllm-engine-file:{FILES[0]}`" in engine_part
    assert "fixtures/deviations/vllm-engine.toml" in engine_part
    document = gate.leg_document(engine, notes)
    assert document["ran"] is True
    assert document["regressions"][0]["rerun"].startswith(f"{engine_python} -m pytest ")


def test_a_report_without_the_engine_leg_says_why():
    markdown = render(
        Path("/repo"), ["f.py"], conformance_leg("pass"), 0, None, [], None, ["not run: why"]
    )
    assert markdown.endswith(f"## {ENGINE_LEG_TITLE}\n\n- not run: why\n")
    assert gate.leg_document(None, ["not run: why"]) == {"ran": False, "notes": ["not run: why"]}
