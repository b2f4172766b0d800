"""The conformance report: merging runs, exit status, the markdown table, the runner's CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.jobs.report import (
    TargetRun,
    build_report,
    covered_space_section,
    exit_status,
    render_markdown,
)
from harness.jobs.results import (
    REPORT_SCHEMA,
    RESULTS_SCHEMA,
    SCHEMA_VERSION,
    Incident,
    IncidentKind,
    Outcome,
    ResultsError,
    TargetStatus,
    read_results,
    read_stopped_checks,
    write_stopped_checks,
)
from harness.jobs.supervisor import Supervised
from suites.harness.helpers import ROOT, needs_vllm, validate


def results(name, *checks):
    document = {
        "schema_version": SCHEMA_VERSION,
        "target": {"name": name, "version": "1", "files": {"f.py": "ab" * 32}},
        "device": "cpu",
        "exit_status": 0,
        "complete": True,
        "stopped": "",
        "selected": len(checks),
        "checks": [
            {
                "id": i,
                "outcome": o,
                "reason": r,
                "runs_on": None,
                "serving": "default",
                "duration_s": 0.0,
            }
            for i, o, r in checks
        ],
        "stale_deviations": [],
        "build_timings": {},
    }
    validate(document, RESULTS_SCHEMA)
    return document


def report_of(runs):
    report = build_report(runs)
    validate(report, REPORT_SCHEMA)  # every report the tests build
    return report


A = "suites/conformance/test_a.py::test_a"
B = "suites/conformance/test_a.py::test_b"


def test_all_pass_or_known_deviation_is_exit_0():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""), (B, "xfail", "known: why"))),
    ]
    report = report_of(runs)
    assert exit_status(report) == 0
    assert report["checks"][1]["results"]["vllm"]["outcome"] == "xfail"
    md = render_markdown(report)
    assert "| `test_a.py::test_b` | default | pass | xfail: known: why |" in md
    assert "`vllm`: `f.py` sha256" in md


def test_the_report_counts_the_oracle_s_answers():
    with_answers = results("vllm", (A, "pass", ""))
    with_answers["phases"] = dict.fromkeys(
        ("start_up_s", "collection_s", "import_s", "builds_s", "checks_s"), 1.0
    )
    with_answers["oracle_answers"] = {"hits": 40, "misses": 2, "uncached": 1}
    md = render_markdown(report_of([TargetRun("vllm", 0, with_answers)]))
    assert (
        "The oracle's answers for `vllm` (the reference, on the parity checks' requests): 40 "
        "read from its cache, 2 computed and kept, 1 computed and not kept"
    ) in md


def test_a_failed_check_is_exit_1():
    runs = [TargetRun("vllm", 1, results("vllm", (A, "fail", "boom"), (B, "xpass", "fixed")))]
    report = report_of(runs)
    assert exit_status(report) == 1
    assert "**FAIL**: boom" in render_markdown(report)


def test_a_target_that_could_not_run_is_exit_2():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""))),
        TargetRun("vllm-file:x.py", 2, None, problem="pytest exited 2 before writing results"),
    ]
    report = report_of(runs)
    assert exit_status(report) == 2
    assert "could not run" in render_markdown(report)


def test_checks_missing_from_a_target_show_a_dash():
    runs = [
        TargetRun("reference", 0, results("reference", (A, "pass", ""), (B, "pass", ""))),
        TargetRun("vllm", 0, results("vllm", (A, "pass", ""))),
    ]
    assert "| `test_a.py::test_b` | default | pass | — |" in render_markdown(report_of(runs))


def test_runner_writes_the_report_and_exits_0_on_reference(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.conformance",
            "--target",
            "reference",
            "--out",
            str(tmp_path),
            "--groups=1",  # one process: its phases add up within the wall time
            "--",
            "-k",
            "pass_through_verbatim",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    validate(json.loads((tmp_path / "results-reference.json").read_text()), RESULTS_SCHEMA)
    assert [t["selector"] for t in report["targets"]] == ["reference"]
    assert report["targets"][0]["summary"]["pass"] == 12
    assert (tmp_path / "conformance.md").read_text().startswith("# Nano-Nemotron VL conformance")
    assert (tmp_path / "junit-reference.xml").is_file()
    # Where the time went: every phase measured, within the wall time the supervisor saw.
    target = report["targets"][0]
    phases = target["phases"]
    assert phases["start_up_s"] > 0  # the interpreter and pytest, from the supervisor's start
    assert phases["builds_s"] > 0  # the reference's model of the default variant
    assert phases["checks_s"] > 0
    assert sum(phases.values()) <= target["wall_s"] + 0.5
    assert report["report_s"] >= 0
    assert "| `reference` | " in (tmp_path / "conformance.md").read_text()


def _main_job(out, *args):
    return subprocess.run(
        [sys.executable, "-m", "harness.jobs.conformance", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@needs_vllm
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.exhaustive
def test_targets_side_by_side_give_the_results_they_give_one_after_the_other(tmp_path):
    """The main job runs its targets at the same time (--jobs, by default one per target up to
    the cores), each process forked from a server that imported torch and vLLM once: every
    check's outcome is the one a sequential run of processes started as new Pythons gives
    (``--no-fork-server``), and each line of the interleaved output says whose it is."""
    selection = ["--", "-k", "pass_through_verbatim or connector"]
    # One process per target, on any number of cores.
    targets = ["--target", "reference", "--target", "vllm", "--groups", "1"]
    together = _main_job(tmp_path / "together", *targets, "--jobs", "2", *selection)
    apart = _main_job(tmp_path / "apart", *targets, "--jobs", "1", "--no-fork-server", *selection)
    assert together.returncode == apart.returncode == 0, together.stdout[-3000:]

    def processes(out):
        report = json.loads((out / "conformance.json").read_text())
        return {t["selector"]: t["processes"] for t in report["targets"]}

    forked = {"forked": 1, "new": 0}
    assert processes(tmp_path / "together") == {"reference": forked, "vllm": forked}
    new = {"forked": 0, "new": 1}
    assert processes(tmp_path / "apart") == {"reference": new, "vllm": new}
    assert "`vllm` 1 forked from a server" in (tmp_path / "together" / "conformance.md").read_text()

    def outcomes(out):
        report = json.loads((out / "conformance.json").read_text())
        validate(report, REPORT_SCHEMA)
        return {
            (selector, check["id"]): result["outcome"]
            for check in report["checks"]
            for selector, result in check["results"].items()
            if result
        }

    assert outcomes(tmp_path / "together") == outcomes(tmp_path / "apart")
    assert len(outcomes(tmp_path / "apart")) >= 20
    lines = together.stdout.splitlines()
    assert any(line.startswith("[vllm] ") for line in lines)
    assert any(line.startswith("[reference] ") for line in lines)
    assert not any(line.startswith("[vllm] ") for line in apart.stdout.splitlines())


def test_a_bad_jobs_count_is_refused_naming_it(tmp_path):
    proc = _main_job(tmp_path, "--target", "reference", "--jobs", "0")
    assert proc.returncode == 2
    assert "--jobs: expected at least 1, got 0" in proc.stderr


def test_runner_exits_2_when_a_target_cannot_load(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.jobs.conformance",
            "--target",
            "reference",
            "--target",
            f"vllm-file:{tmp_path / 'absent.py'}",
            "--out",
            str(tmp_path),
            "--",
            "-k",
            "pass_through_verbatim",  # a few checks: the statuses are what is asserted
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout[-3000:]
    report = json.loads((tmp_path / "conformance.json").read_text())
    validate(report, REPORT_SCHEMA)
    assert [t["status"] for t in report["targets"]] == ["ok", "could not run"]


def test_runner_rejects_a_bad_option_with_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.jobs.conformance", "--device", "tpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "--device" in proc.stderr


def test_the_schemas_name_the_outcomes_and_version_the_code_writes():
    for path in (RESULTS_SCHEMA, REPORT_SCHEMA):
        schema = json.loads(path.read_text())
        assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}, path.name
    outcomes = json.loads(RESULTS_SCHEMA.read_text())["$defs"]["outcome"]["enum"]
    assert outcomes == [o.value for o in Outcome]
    target = json.loads(REPORT_SCHEMA.read_text())["$defs"]["target"]["properties"]
    assert target["summary"]["required"] == [o.value for o in Outcome]
    assert target["status"]["enum"] == sorted(
        (s.value for s in TargetStatus), key=target["status"]["enum"].index
    )
    kinds = json.loads(RESULTS_SCHEMA.read_text())["$defs"]["incident"]["properties"]["kind"]
    assert kinds["enum"] == [k.value for k in IncidentKind]


def supervised(*incidents):
    return Supervised(
        exit_status=0,
        incidents=[
            Incident(kind=kind, check=check, detail=detail, at_s=1.0)
            for kind, check, detail in incidents
        ],
        restarts=len(incidents),
        peak_memory_gib=1.5,
        slowest_check=(A, 2.0),
        wall_s=3.0,
    )


@pytest.mark.parametrize(
    ("outcomes", "incidents", "status", "exit"),
    [
        ([(A, "pass", "")], [], "ok", 0),
        ([(A, "fail", "exceeded the check time limit")], [("timeout", A, "limit")], "failed", 1),
        ([(A, "fail", "over the memory limit")], [("memory", A, "limit")], "failed", 1),
        ([(A, "error", "died")], [("crash", A, "killed by SIGSEGV (11)")], "crashed", 2),
        ([(A, "pass", "")], [("timeout", None, "in the session's teardown")], "incomplete", 2),
        (
            [(A, "fail", "exceeded")],
            [("timeout", A, "limit"), ("gave up", None, "stopped after 0 restarts")],
            "incomplete",
            2,
        ),
        ([(A, "pass", "")], [("interrupted", B, "SIGTERM")], "interrupted", 2),
    ],
    ids=["clean", "timeout", "memory", "crash", "outside-a-check", "gave-up", "interrupted"],
)
def test_faults_set_the_status_and_exit(outcomes, incidents, status, exit):
    """Per the issue: a check past its time or memory limit FAILs (exit 1); a crash, restarts
    that ran out, a fault outside any check or an interruption make the run incomplete (exit 2,
    never 0)."""
    run = TargetRun("vllm", 0, results("vllm", *outcomes), supervised=supervised(*incidents))
    report = report_of([run])
    assert report["targets"][0]["status"] == status
    assert exit_status(report) == exit
    markdown = render_markdown(report)
    for kind, check, detail in incidents:
        where = f"in `{check}`" if check else "outside any check"
        assert f"**{kind}** {where} at 1 s: {detail}" in markdown


def test_a_fault_in_the_last_check_fails_the_run_and_no_more():
    """The last check timed out: the restarted process finds every check recorded and runs
    none (pytest's exit 5). That is a failed check, not a target the harness could not run."""
    document = results("vllm", (A, "pass", ""), (B, "fail", "exceeded the check time limit"))
    run = TargetRun("vllm", 5, document, supervised=supervised(("timeout", B, "limit")))
    report = report_of([run])
    assert (report["targets"][0]["status"], report["targets"][0]["problem"]) == ("failed", "")
    assert exit_status(report) == 1


def test_no_check_at_all_is_said_so():
    report = report_of([TargetRun("vllm", 5, results("vllm"))])
    assert report["targets"][0]["problem"] == "no conformance checks ran"
    assert exit_status(report) == 2


def test_a_results_file_left_by_a_dead_process_is_incomplete():
    document = results("vllm", (A, "pass", "")) | {"complete": False, "exit_status": None}
    report = report_of([TargetRun("vllm", -9, document)])
    assert report["targets"][0]["status"] == "incomplete"
    assert exit_status(report) == 2


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--check-timeout=0", "--check-timeout: expected a number > 0, got 0.0"),
        ("--memory-limit=-1", "--memory-limit: expected a number > 0, got -1.0"),
        ("--max-restarts=-2", "--max-restarts: expected an integer >= 0, got -2"),
        ("--check-timeout=soon", "--check-timeout: invalid float value: 'soon'"),
    ],
)
def test_runner_rejects_bad_limits_naming_the_option(tmp_path, option, message):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.jobs.conformance", option, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "conformance.json").exists()


def test_resume_keeps_finished_checks_and_runs_the_rest(tmp_path):
    """What a restarted process does after a fault: the checks already in the results file are
    kept as they are (a recorded FAIL is not run again), the others run."""
    from suites.harness.helpers import run_suites

    def run(*extra):
        return run_suites(
            tmp_path,
            "-k",
            "pass_through_verbatim and image_embeds",
            *extra,
            suite="suites/conformance/test_passthrough.py",
        )

    path = tmp_path / "results.json"  # where run_suites writes
    first = run()
    assert first.returncode == 0, first.output[-3000:]
    document = read_results(path)
    ids = [c["id"] for c in document["checks"]]
    assert len(ids) == document["selected"] >= 3
    assert document["complete"]
    # As a timeout leaves it: the stopped check recorded by the process after the killed one.
    document["checks"] = [recorded_timeout(ids[0])]
    document["complete"] = False
    path.write_text(json.dumps(document))
    second = run("--resume")
    assert second.returncode == 0, second.output[-3000:]
    assert f"{len(ids) - 1} passed, " in second.output
    resumed = read_results(path)
    assert resumed["complete"]
    # The second process's phases add to the first's.
    for phase, seconds in document["phases"].items():
        assert resumed["phases"][phase] >= seconds, phase
    assert {c["id"]: c["outcome"] for c in resumed["checks"]} == {
        ids[0]: "fail",
        **{i: "pass" for i in ids[1:]},
    }


def recorded_timeout(check_id):
    return {
        "id": check_id,
        "outcome": "fail",
        "reason": "exceeded the check time limit of 1 s",
        "runs_on": "real model",
        "serving": "default",
        "duration_s": 0.0,
    }


def test_a_report_that_breaks_the_schema_is_caught():
    report = report_of([TargetRun("vllm", 0, results("vllm", (A, "pass", "")))])
    report["targets"][0]["status"] = "fine"
    with pytest.raises(Exception, match="'fine' is not one of"):
        validate(report, REPORT_SCHEMA)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 0}, f"schema_version: expected {SCHEMA_VERSION}, got 0"),
        ({"checks": [{"id": A, "outcome": "passed"}]}, r"checks\[0\].outcome: expected one of"),
        ({"device": None, "build_timings": None}, None),
    ],
    ids=["version", "outcome", "nulls-pass-the-reader"],
)
def test_the_reader_refuses_results_it_cannot_use(tmp_path, change, message):
    document = results("vllm", (A, "pass", "")) | change
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    if message is None:
        assert read_results(path)["checks"][0]["id"] == A
        return
    with pytest.raises(ResultsError, match=message):
        read_results(path)


def test_the_reader_names_missing_fields(tmp_path):
    document = results("vllm")
    del document["checks"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsError, match=r"expected the fields \['checks'\]"):
        read_results(path)


def test_self_consistency_checks_are_labelled(tmp_path):
    """A check marked ``self_consistency`` (it compares the target with itself) carries the label
    into the results and the report; the others do not."""
    from suites.harness.helpers import run_suites

    run = run_suites(
        tmp_path,
        "-k",
        "unrelated_kwargs_are_ignored or audio_gives_valid_frames_only",
        suite="suites/conformance/test_routing.py",
    )
    assert run.returncode == 0, run.output[-3000:]
    labelled = {c["id"]: c.get("self_consistency") for c in run.results["checks"]}
    routing = "suites/conformance/test_routing.py::"
    assert labelled == {
        f"{routing}test_unrelated_kwargs_are_ignored": (
            "a call with unrelated arguments against the same call without"
        ),
        f"{routing}test_audio_gives_valid_frames_only": None,
    }
    markdown = render_markdown(report_of([TargetRun("reference", 0, run.results)]))
    assert (
        "| `test_routing.py::test_unrelated_kwargs_are_ignored` | default | pass [real model] "
        in markdown
    )
    assert "(self-consistency) |" in markdown
    assert "Self-consistency checks (1)" in markdown


def test_what_checks_measured_is_listed_by_kind():
    """Parity, sensitivity and features numbers each get their own list in the report, with
    the numbers the checks recorded (hand-written here)."""
    document = results(
        "vllm",
        (
            "suites/conformance/test_parity.py::test_request_matches_the_reference[audios]",
            "pass",
            "",
        ),
        (
            "suites/conformance/test_sensitivity.py::test_rows_depend_on_the_input[audio-hop-160]",
            "pass",
            "",
        ),
        (
            "suites/conformance/test_features.py::test_features_match_the_reference[audios]",
            "pass",
            "",
        ),
        ("suites/conformance/test_parity.py::test_connector_matches_the_reference", "pass", ""),
        (
            "suites/conformance/test_lora_adapters.py::test_each_adapted_layer_adds_its_tokens_delta[q_proj]",
            "pass",
            "",
        ),
    )
    parity, sensitivity, features, connector, lora = document["checks"]
    lora["measured"] = {
        "language_model.backbone.layers.2.mixer.q_proj": {
            "kind": "lora",
            "max_token_error": 0.00312,
            "bound": 0.0078125,
        }
    }
    connector["measured"] = {
        "connector": {"dtype": "bfloat16", "relative_error": 0.0047, "bound": 0.0625}
    }
    parity["measured"] = {
        "audio[0]": {"dtype": "bfloat16", "relative_error": 0.0041, "bound": 0.0625},
        "audio[1]": {  # as harness.oracles.rows records a tower item
            "path": "audio-hop-160",
            "dtype": "bfloat16",
            "relative_error": 0.0093,
            "separator_rows_exact": 0,
            "global_error": 0.0093,
            "row_error": 0.0186,
            "channel_error": 0.0195,
            "bound": 0.0297,
            "global_bound": 0.0297,
            "row_bound": 0.0625,
            "channel_bound": 0.0608,
            "bound_source": "calibrated on vllm 0.33.0: 144 samples",
            "bound_method": "log-normal fit of 144 samples",
        },
    }
    sensitivity["measured"] = {
        "audio-hop-160": {
            "kind": "sensitivity",
            "dtype": "bfloat16",
            "difference": 0.603,
            "bound": 0.0625,
            "ratio": 9.65,
            "minimum_ratio": 4.0,
        }
    }
    features["measured"] = {
        "audio[0] input_audio_features": {
            "kind": "features",
            "dtype": "float32",
            "max_abs_error": 2.15e-06,
            "atol": 0.0001,
            "rtol": 1e-05,
        }
    }
    validate(document, RESULTS_SCHEMA)
    md = render_markdown(report_of([TargetRun("vllm", 0, document)]))
    assert "- audios: audio[0] 4.10e-03 ≤ 0.0625 (bfloat16), audio[1] 9.30e-03 ≤ 0.0297" in md
    assert (
        "| audio-hop-160 | bfloat16 | 1 | 0.0093 / 0.0297 | 0.0186 / 0.0625 | 0.0195 / 0.0608 "
        "| calibrated on vllm 0.33.0: 144 samples |" in md
    )
    assert "- audio-hop-160 (bfloat16): log-normal fit of 144 samples" in md
    assert "- test_connector_matches_the_reference: connector 4.70e-03 ≤ 0.0625" in md
    assert "- language_model.backbone.layers.2.mixer.q_proj: 0.00312 ≤ 0.00781" in md
    assert "- audio-hop-160: 0.603 / 0.0625 (bfloat16) = 9.65x (at least 4x)" in md
    assert (
        "- audios audio[0] input_audio_features: 2.15e-06 (float32; atol 0.0001, rtol 1e-05)" in md
    )


# ---------------------------------------------------------------------------------------------
# Stopped checks: what the supervisor hands the next process (the plugin records them)


def test_stopped_checks_round_trip(tmp_path):
    path = tmp_path / "stopped.json"
    checks = [{"id": "suites/x.py::t", "outcome": "error", "reason": "killed by SIGSEGV"}]
    write_stopped_checks(path, checks)
    assert read_stopped_checks(path) == checks


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "expected a JSON list of stopped checks"),
        ('{"id": "x"}', "expected a JSON list, got dict"),
        ('[{"id": "x", "outcome": "fail"}]', "[0]: expected id, outcome and reason strings"),
        (
            '[{"id": "x", "outcome": "pass", "reason": "r"}]',
            "[0].outcome: expected one of ['error', 'fail'], got 'pass'",
        ),
    ],
    ids=["not-json", "not-a-list", "no-reason", "a-pass"],
)
def test_a_bad_stopped_checks_file_is_refused_naming_the_field(tmp_path, text, says):
    path = tmp_path / "stopped.json"
    path.write_text(text)
    with pytest.raises(ResultsError) as caught:
        read_stopped_checks(path)
    assert says in str(caught.value)


def test_the_pairs_section_lists_every_variant_of_the_covering_array_with_its_outcomes():
    from harness.checkpoints.pairs import changed_options, covering_array
    from harness.jobs.report import PAIRWISE_CHECK

    first, second = covering_array()[:2]
    runs = [
        TargetRun(
            "vllm",
            1,
            results(
                "vllm",
                (f"{PAIRWISE_CHECK}[{first.slug}]", "pass", ""),
                (f"{PAIRWISE_CHECK}[{second.slug}]", "fail", "2 problems: boom"),
            ),
        )
    ]
    text = render_markdown(report_of(runs))
    assert "## Pairs of options" in text
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| `v2-") or line.startswith("| `omni-")
    ]
    assert len(rows) == len(covering_array())
    changed = ", ".join(f"{k}={v}" for k, v in changed_options(first).items())
    assert f"| `{first.slug}` | {changed} | pass |" in text
    assert f"| `{second.slug}` |" in text
    assert "**FAIL**: 2 problems: boom" in text


def test_no_pairs_section_without_the_pairwise_check():
    runs = [TargetRun("vllm", 0, results("vllm", (A, "pass", "")))]
    assert "## Pairs of options" not in render_markdown(report_of(runs))


def test_the_report_shows_the_config_fields_and_the_unreached_lines(tmp_path):
    """From the committed reports' forms: the inventory's verdict counts with the fields it
    leaves uncaught, and the reach map's summary with its lines per reason; nothing when
    neither report exists."""
    assert covered_space_section(tmp_path) == []
    field = {"section": "text_config", "field": "use_conv_bias", "verdict": "not caught"}
    (tmp_path / "config-fields.json").write_text(
        json.dumps(
            {
                "meta": {"vllm": "0.33.0"},
                "verdicts": {"caught": 3, "not caught": 1},
                "fields": [field],
            }
        )
    )
    (tmp_path / "unreached.md").write_text(
        "# Lines\n\n7 of 9 functions in scope are reached.\n\n| reason | lines |\n|---|---|\n"
        "| gpu | 4 |\n\n| function | lines |\n"
    )
    text = "\n".join(covered_space_section(tmp_path))
    assert "vLLM 0.33.0): 3 caught, 1 not caught." in text
    assert "- not caught: `text_config.use_conv_bias`" in text
    assert "7 of 9 functions in scope are reached." in text
    assert "| gpu | 4 |" in text
    assert "| function | lines |" not in text
