"""The flake hunt (``nemotron-vl-flakes``): its runs vary what the issue names, its comparison
finds a check with two outcomes, and a real hunt finds a check whose outcome depends on the
thread count (made so by a plugin loaded into its main jobs) and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.jobs.cores import THREAD_VARIABLES
from harness.jobs.flakes import (
    RUN_KINDS,
    RunOutcome,
    hunt_report,
    main,
    not_in_every_run,
    plan_runs,
    processes_naming,
    render_markdown,
    unstable_checks,
)
from harness.jobs.forkserver import SHARED_SERVERS_ENV
from suites.harness.thread_dependent_plugin import THREAD_DEPENDENT


def test_five_runs_vary_threads_orders_groupings_processes_and_the_oracle_cache():
    runs = plan_runs(5, seed=3, cores=2)
    assert [r.kind for r in runs] == list(RUN_KINDS)
    counts = [r.thread_counts() for r in runs]
    assert [1] in counts, "fixed at one thread"
    assert [2] in counts, "fixed at every core"
    assert any(len(set(c)) > 1 for c in counts), "a count that changes between checks"
    assert any(r.kind.threads == "share" for r in runs), "the main job's own core share"
    seeds = [r.seed for r in runs if r.seed is not None]
    assert len(set(seeds)) == len(seeds) == 4, "each shuffled run its own order"
    assert any(r.seed is None for r in runs), "and one run in file order"
    assert {r.kind.groups for r in runs} >= {1, 2}
    assert {r.kind.fork_server for r in runs} == {True, False}
    assert {r.kind.oracle_cache for r in runs} == {True, False}
    warm = [r.index for r in runs if r.kind.keep_warm]
    assert warm, "a run keeps its fork servers warm"
    assert any(r.kind.fork_server for r in runs if r.index > warm[0]), "a later run forks there"
    assert plan_runs(5, seed=3, cores=2) == runs, "a hunt replays from its seed"
    assert [r.seed for r in plan_runs(5, seed=4, cores=2)] != [r.seed for r in runs]


def _option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_a_run_passes_its_settings_to_the_main_job(tmp_path):
    share, one, _, schedule, groups = plan_runs(5, seed=3, cores=4)
    command = schedule.command(["reference"], tmp_path, ["-k", "x"])
    assert command[command.index("--") + 1 :] == [
        "-p",
        "randomly",
        f"--randomly-seed={schedule.seed}",
        "--thread-schedule=4,1",
        "-k",
        "x",
    ]
    assert "--no-fork-server" in command
    assert _option(command, "--jobs") == "1"
    assert _option(command, "--groups") == "1"
    assert _option(groups.command(["vllm"], tmp_path, []), "--groups") == "2"
    # A fixed or scheduled count is the caller's: the main job then shares no cores.
    assert {v: schedule.environment()[v] for v in THREAD_VARIABLES} == dict.fromkeys(
        THREAD_VARIABLES, "4"
    )
    assert one.environment()["NEMOTRON_VL_ORACLE_CACHE"] == "off"
    # The user's run shares the cores as the main job does, whatever the caller set; no run
    # forks from a test run's shared servers in place of its own.
    base = {"OMP_NUM_THREADS": "1", "PATH": "/bin", SHARED_SERVERS_ENV: "/tmp/servers"}
    env = share.process_environment(base)
    assert not (set(THREAD_VARIABLES) | {SHARED_SERVERS_ENV}) & set(env)
    assert env["PATH"] == "/bin"
    assert SHARED_SERVERS_ENV not in one.process_environment(base)
    assert "--" not in share.command(["reference"], tmp_path, [])
    # A replay sets what the run set and what steered the hunt's checks, nothing else.
    replay = share.replay(["reference"], tmp_path, [], {"PYTHONHASHSEED": "0", "HOME": "/r"})
    assert replay.startswith("env -u OMP_NUM_THREADS")
    assert "PYTHONHASHSEED=0" in replay
    assert "HOME" not in replay


def _outcome(index: int, checks: dict[str, tuple[str, str]]) -> RunOutcome:
    run = plan_runs(index, seed=1, cores=2)[index - 1]
    return RunOutcome(run, 0, 1.0, "replay", {"vllm": checks})


def test_a_check_with_two_outcomes_is_unstable_and_a_missing_one_is_counted():
    runs = [
        _outcome(2, {"a": ("pass", ""), "b": ("xfail", "cause"), "c": ("pass", "")}),
        _outcome(3, {"a": ("fail", "boom\nmore"), "b": ("xfail", "cause")}),
        _outcome(4, {"a": ("pass", ""), "b": ("xfail", "other words, one outcome")}),
    ]
    [unstable] = unstable_checks(runs)
    assert (unstable.target, unstable.check) == ("vllm", "a")
    assert unstable.outcomes == {2: ("pass", ""), 3: ("fail", "boom\nmore"), 4: ("pass", "")}
    assert not_in_every_run(runs) == {"vllm": 1}
    report = hunt_report(1, ["vllm"], runs, "nemotron-vl-flakes")
    text = render_markdown(report)
    assert "1 unstable checks" in text
    assert "run 3: fail boom" in text
    assert unstable_checks(runs[2:]) == [], "one run: nothing to compare"


def test_too_few_runs_or_an_unknown_target_are_refused_naming_the_option(tmp_path, capsys):
    assert main(["--runs", "1", "--out", str(tmp_path)]) == 2
    assert "--runs: expected at least 2, got 1" in capsys.readouterr().err
    assert main(["--runs", "x"]) == 2
    assert main(["--target", "refrence", "--out", str(tmp_path)]) == 2
    assert "--target: expected one of reference, vllm" in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing run"


@pytest.mark.slow
def test_a_hunt_finds_the_check_whose_outcome_depends_on_the_thread_count(tmp_path, capsys):
    """Three runs (the user's, one thread, every core) of two checks on the reference, with a
    plugin that fails one of them above one thread: that check is unstable, the other not."""
    selection = "test_request_is_processed_and_embedded and (images-pil or images-array)"
    extra = ["-p", "suites.harness.thread_dependent_plugin", "-k", selection]
    hunt = ["--target", "reference", "--runs", "3", "--seed", "5", "--out", str(tmp_path)]
    status = main([*hunt, "--", *extra])
    report = json.loads((tmp_path / "flakes.json").read_text())
    assert [r["exit_status"] for r in report["runs"]][1:] == [0, 1], report["runs"]
    assert report["compared"] == {"reference": 2}
    [unstable] = report["unstable"]
    assert unstable["check"].endswith(THREAD_DEPENDENT)
    outcomes = {run: o["outcome"] for run, o in unstable["outcomes"].items()}
    assert outcomes["2"] == "pass"
    assert outcomes["3"] == "fail"
    assert "ran at 2 threads" in unstable["outcomes"]["3"]["reason"]
    assert status == 1
    assert THREAD_DEPENDENT in (tmp_path / "flakes.md").read_text()
    assert "--randomly-seed=" in report["runs"][2]["replay"]
    assert "--keep-warm" in report["runs"][2]["replay"]
    # Run 3 kept a warm server of its own (not the test run's shared ones), and the hunt
    # retired it at its end: it no longer runs, its folder is gone.
    assert any("a warm server started" in line for line in report["runs"][2]["fork_servers"])
    assert not processes_naming(report["warm_servers"])
    assert not Path(report["warm_servers"]).exists()
