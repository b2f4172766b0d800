"""``nemotron-vl-flakes``: the flake hunt. Runs the main job again and again under other
scheduling, and lists every check whose outcome changed.

    nemotron-vl-flakes [--target T ...] [--runs N] [--seed S] [--out reports/flakes]
                       [-- extra pytest arguments]

A check's outcome must not depend on how the run was scheduled: torch's thread count (fixed,
or changed between checks as the main job does when a process ends), the order of the checks
(pytest-randomly, seeded), how they are grouped into processes, a process forked from a
preloaded server (kept warm by an earlier run, or not) or a new Python, the oracle's answers
read from its cache or computed afresh.
Each run is one main job (:mod:`harness.jobs.conformance`, with ``--rerun``: nothing reused)
over every target, under one of the :data:`RUN_KINDS` in turn, each shuffled run with its own
seed drawn from the hunt's seed (``--seed``; a fresh one by default, reported, so that a hunt
replays). The outcomes of every run are compared check by check; a check with two outcomes is
unstable, listed with each run's outcome and reason and the command that reruns that run.

The report is ``<out>/flakes.md`` and ``flakes.json`` (each run's main-job report in
``<out>/run-K/``). Exit status: 0 every run complete and no check unstable; 1 a check unstable;
2 a bad option or a run that did not complete (its checks are compared as far as it went, and
the checks that changed are listed all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from harness import ROOT
from harness.jobs.conformance import available_targets, slug
from harness.jobs.cores import THREAD_VARIABLES
from harness.jobs.forkserver import SHARED_SERVERS_ENV
from harness.jobs.kept import steering_environment
from harness.jobs.processes import kill_group
from harness.jobs.results import ResultsError, read_results, replace_text
from harness.jobs.warm import WARM_SERVERS_ENV, retire_all
from harness.targets import TargetLoadError, resolve_target

DEFAULT_OUT = ROOT / "reports" / "flakes"
DEFAULT_RUNS = 5
#: Minutes a run's warm servers outlive it unused: longer than the runs after it take (a main
#: job each); the hunt retires them at its end.
KEEP_WARM_MIN = 600
#: Seconds the hunt waits for its retired warm servers to end before removing their folder.
WARM_EXIT_WAIT_S = 30


@dataclass(frozen=True)
class RunKind:
    """How one run of the hunt schedules the checks; the defaults are the hunt's usual run
    (each kind states how it departs from them)."""

    name: str
    #: what the run varies, for the report
    about: str
    #: torch's threads: ``"share"`` (the main job's core share: counts change as its processes
    #: end), ``"one"``, ``"all"`` (every core), or a schedule ``"all,one"`` (another count before
    #: every check, :mod:`harness.plugin.cores`)
    threads: str
    #: the checks in a seeded random order (pytest-randomly), or in file order
    shuffled: bool = True
    #: processes of whole modules side by side per target (``--groups``; 0: the main job's own
    #: choice); targets side by side (``--jobs``; 0: the main job's own choice)
    groups: int = 1
    jobs: int = 1
    fork_server: bool = True
    oracle_cache: bool = True
    #: the run's fork servers kept warm for the later runs (``--keep-warm``), which fork from
    #: them while they are current
    keep_warm: bool = False


#: The runs of a hunt, in turn (a longer hunt starts again from the first).
RUN_KINDS: tuple[RunKind, ...] = (
    RunKind(
        "as a user runs it",
        "the main job's defaults: targets and groups side by side, forked processes, each "
        "handed a finished process's cores mid-run",
        "share",
        shuffled=False,
        groups=0,
        jobs=0,
    ),
    RunKind(
        "one thread",
        "one process per target, one thread, new Pythons, the oracle computed afresh",
        "one",
        fork_server=False,
        oracle_cache=False,
    ),
    RunKind(
        "every core",
        "one process per target, a thread per core, the oracle's answers from its cache, its "
        "fork servers kept warm for the later runs",
        "all",
        keep_warm=True,
    ),
    RunKind(
        "threads change every check",
        "one process per target, the thread count changed before every check",
        "all,one",
        fork_server=False,
        oracle_cache=False,
    ),
    RunKind(
        "two groups",
        "two processes of whole modules per target side by side, forked from the warm servers "
        "an earlier run kept, the thread count changed before every check",
        "one,all",
        groups=2,
    ),
)


@dataclass(frozen=True)
class Run:
    """One run of the hunt: its kind, its seed (None: file order) and its main job."""

    index: int
    kind: RunKind
    seed: int | None
    cores: int

    def thread_counts(self) -> list[int]:
        """The counts the run's checks run at, in turn; none for the main job's own share."""
        if self.kind.threads == "share":
            return []
        counts = {"one": 1, "all": max(2, self.cores)}  # two at least: a count that changes
        return [counts[part] for part in self.kind.threads.split(",")]

    def environment(self) -> dict[str, str]:
        """The variables the run sets (the rest of the environment is the hunt's)."""
        env = {"NEMOTRON_VL_KEPT_OUTCOMES": "off"}
        if not self.kind.oracle_cache:
            env["NEMOTRON_VL_ORACLE_CACHE"] = "off"
        if self.kind.threads != "share":
            # A thread count the caller set stands: the main job then shares no cores.
            first = str(self.thread_counts()[0])
            env.update(dict.fromkeys(THREAD_VARIABLES, first))
        return env

    def process_environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the run's variables; a run that shares the cores as the main job does
        drops any thread count ``base`` sets (one set stands, and no count would change)."""
        env = {**base, **self.environment()}
        if self.kind.threads == "share":
            for variable in THREAD_VARIABLES:
                env.pop(variable, None)
        # A test run's shared fork servers would stand in for the run's own (forked, warm or
        # none): each run starts what its kind says.
        env.pop(SHARED_SERVERS_ENV, None)
        return env

    def pytest_arguments(self) -> list[str]:
        args = []
        if self.seed is not None:
            args += ["-p", "randomly", f"--randomly-seed={self.seed}"]
        if "," in self.kind.threads:
            args.append("--thread-schedule=" + ",".join(map(str, self.thread_counts())))
        return args

    def command(self, targets: Sequence[str], out: Path, extra: Sequence[str]) -> list[str]:
        """The main job of this run."""
        command = ["-m", "harness.jobs.conformance", "--out", str(out), "--rerun"]
        for target in targets:
            command += ["--target", target]
        if self.kind.jobs:
            command += ["--jobs", str(self.kind.jobs)]
        if self.kind.groups:
            command += ["--groups", str(self.kind.groups)]
        if not self.kind.fork_server:
            command.append("--no-fork-server")
        if self.kind.keep_warm:
            command += ["--keep-warm", str(KEEP_WARM_MIN)]
        pytest_args = [*self.pytest_arguments(), *extra]
        return [sys.executable, *command, *(["--", *pytest_args] if pytest_args else [])]

    def replay(
        self,
        targets: Sequence[str],
        out: Path,
        extra: Sequence[str],
        hunt_environment: Mapping[str, str],
    ) -> str:
        """The shell line that runs this run again (its report into ``out``): the run's
        variables and those of the hunt's environment that steer the checks."""
        env = {**steering_environment(hunt_environment), **self.environment()}
        env.pop(WARM_SERVERS_ENV, None)  # the hunt's folder is gone: the user's own is used
        variables = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
        if self.kind.threads == "share":
            variables = [f"-u {v}" for v in THREAD_VARIABLES] + variables
        command = self.command(targets, out, extra)
        return f"env {' '.join(variables)} nemotron-vl-conformance {shlex.join(command[3:])}"


def plan_runs(count: int, seed: int, cores: int) -> list[Run]:
    """``count`` runs: :data:`RUN_KINDS` in turn, each shuffled run with a seed of its own drawn
    from ``seed``."""
    draw = random.Random(seed)
    runs = []
    for index in range(count):
        kind = RUN_KINDS[index % len(RUN_KINDS)]
        run_seed = draw.randrange(1, 2**31)
        runs.append(Run(index + 1, kind, run_seed if kind.shuffled else None, cores))
    return runs


@dataclass
class RunOutcome:
    """What one run gave: each target's outcome and reason per check, and how the run ended."""

    run: Run
    exit_status: int
    wall_s: float
    replay: str
    checks: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: the main job's lines about its fork servers (started, forked from a warm one, kept)
    fork_servers: list[str] = field(default_factory=list)


def read_run(out: Path, targets: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Each target's checks in the run's results (``{target: {id: (outcome, reason)}}``), and
    what kept a target's results from being whole."""
    checks: dict[str, dict[str, tuple[str, str]]] = {}
    problems: list[str] = []
    for target in targets:
        path = out / f"results-{slug(target)}.json"
        try:
            results = read_results(path)
        except (OSError, ResultsError) as e:
            problems.append(f"{target}: no results ({e})")
            continue
        if not results["complete"]:
            done, selected = len(results["checks"]), results["selected"]
            problems.append(f"{target}: incomplete ({done} of {selected} checks)")
        checks[target] = {c["id"]: (c["outcome"], c["reason"]) for c in results["checks"]}
    return checks, problems


@dataclass(frozen=True)
class Unstable:
    """A check with more than one outcome over the runs: each run's outcome and reason."""

    target: str
    check: str
    outcomes: dict[int, tuple[str, str]]


def unstable_checks(runs: Sequence[RunOutcome]) -> list[Unstable]:
    """Every check (per target) whose outcome is not the same in every run that ran it."""
    seen: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
    for outcome in runs:
        for target, checks in outcome.checks.items():
            for check, result in checks.items():
                seen.setdefault((target, check), {})[outcome.run.index] = result
    return [
        Unstable(target, check, per_run)
        for (target, check), per_run in sorted(seen.items())
        if len({result[0] for result in per_run.values()}) > 1
    ]


def not_in_every_run(runs: Sequence[RunOutcome]) -> dict[str, int]:
    """Per target, how many checks some run that ran the target did not report."""
    missing: dict[str, int] = {}
    for target in sorted({t for r in runs for t in r.checks}):
        sets = [set(r.checks[target]) for r in runs if target in r.checks]
        everywhere = sets[0].intersection(*sets[1:])
        missing[target] = len(sets[0].union(*sets[1:]) - everywhere)
    return missing


def processes_naming(text: str) -> list[int]:
    """The processes whose command line holds ``text`` (a warm server's names its socket)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in command:
                found.append(int(entry.name))
    return found


def run_hunt(
    targets: Sequence[str],
    runs: Sequence[Run],
    out: Path,
    extra: Sequence[str],
    log: TextIO | None = None,
) -> tuple[list[RunOutcome], Path]:
    """Each run's main job in turn, its output in ``<out>/run-K/main-job.log``; the warm
    servers they keep wait in a folder of the hunt's own (returned), retired at its end."""
    # Short, under the system temporary folder: a Unix socket's path must stay under 108 bytes.
    warm = Path(tempfile.mkdtemp(prefix="nvl-flakes-warm-"))
    try:
        env = {**os.environ, WARM_SERVERS_ENV: str(warm)}
        return [_run_one(run, len(runs), targets, out, extra, env, log) for run in runs], warm
    finally:
        retire_all(folder=warm)
        deadline = time.monotonic() + WARM_EXIT_WAIT_S
        while processes_naming(str(warm)) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(warm, ignore_errors=True)


def _run_one(
    run: Run,
    count: int,
    targets: Sequence[str],
    out: Path,
    extra: Sequence[str],
    env: Mapping[str, str],
    log: TextIO | None,
) -> RunOutcome:
    log = log or sys.stdout
    run_out = out / f"run-{run.index}"
    shutil.rmtree(run_out, ignore_errors=True)  # nothing of an earlier hunt is read as this run's
    run_out.mkdir(parents=True)
    seed = f", seed {run.seed}" if run.seed is not None else ", file order"
    print(f"=== flake hunt: run {run.index} of {count}: {run.kind.name}{seed} ===", file=log)
    log.flush()
    started = time.monotonic()
    with (run_out / "main-job.log").open("w") as output:
        process = subprocess.Popen(
            run.command(targets, run_out, extra),
            cwd=ROOT,
            env=run.process_environment(env),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = process.wait()
        except BaseException:  # Ctrl-C or SIGTERM: the main job stops its targets, reports
            kill_group(process, signal.SIGTERM)
            raise
    wall = time.monotonic() - started
    checks, problems = read_run(run_out, targets)
    if status not in (0, 1):
        problems.append(f"the main job did not complete (exit {status}; see main-job.log)")
    text = (run_out / "main-job.log").read_text(errors="replace")
    servers = [line for line in text.splitlines() if line.startswith("=== fork servers:")]
    replay = run.replay(targets, out / f"replay-{run.index}", extra, env)
    print(f"    exit {status} in {wall:.0f} s" + "".join(f"; {p}" for p in problems), file=log)
    return RunOutcome(run, status, wall, replay, checks, problems, servers)


def hunt_report(
    seed: int,
    targets: Sequence[str],
    outcomes: Sequence[RunOutcome],
    command: str,
    warm_servers: Path | None = None,
) -> dict[str, Any]:
    """The hunt's report (``flakes.json``): its runs, what was compared, what changed."""
    unstable = unstable_checks(outcomes)
    return {
        "command": command,
        "seed": seed,
        "targets": list(targets),
        "warm_servers": str(warm_servers) if warm_servers else None,
        "runs": [
            {
                "index": o.run.index,
                "kind": o.run.kind.name,
                "about": o.run.kind.about,
                "settings": {**asdict(o.run.kind), "seed": o.run.seed},
                # none: the main job's own share of the cores, changing as its processes end
                "thread_counts": o.run.thread_counts(),
                "exit_status": o.exit_status,
                "wall_s": round(o.wall_s, 1),
                "checks": {t: len(c) for t, c in o.checks.items()},
                "problems": o.problems,
                "fork_servers": o.fork_servers,
                "replay": o.replay,
            }
            for o in outcomes
        ],
        "compared": {t: len({c for o in outcomes for c in o.checks.get(t, {})}) for t in targets},
        "not_in_every_run": not_in_every_run(outcomes),
        "unstable": [
            {
                "target": u.target,
                "check": u.check,
                "outcomes": {
                    str(k): {"outcome": o, "reason": r} for k, (o, r) in u.outcomes.items()
                },
            }
            for u in unstable
        ],
    }


def _first_line(text: str, width: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return (line[: width - 3] + "...") if len(line) > width else line


def render_markdown(report: Mapping[str, Any]) -> str:
    lines = [
        "# Flake hunt",
        "",
        f"`{report['command']}`: seed {report['seed']}, targets {', '.join(report['targets'])}, "
        f"{len(report['runs'])} runs.",
        "",
        "| run | kind | seed | threads | exit | wall (s) | checks | problems |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        threads = ", ".join(map(str, r["thread_counts"])) or "the main job's share"
        checks = ", ".join(f"{t} {n}" for t, n in r["checks"].items())
        seed = r["settings"]["seed"] if r["settings"]["seed"] is not None else "file order"
        lines.append(
            f"| {r['index']} | {r['kind']} | {seed} | {threads} | {r['exit_status']} | "
            f"{r['wall_s']} | {checks} | {'; '.join(r['problems']) or '—'} |"
        )
    lines += ["", "What each run varies:", ""]
    for r in report["runs"]:
        lines.append(f"- run {r['index']} ({r['kind']}): {r['about']}. Again: `{r['replay']}`")
        lines += [f"  - {line.strip('= ')}" for line in r["fork_servers"]]
    compared = ", ".join(f"{t} {n}" for t, n in report["compared"].items())
    missing = ", ".join(f"{t} {n}" for t, n in report["not_in_every_run"].items())
    lines += ["", f"Checks compared: {compared}; not reported by every run: {missing}.", ""]
    if not report["unstable"]:
        lines.append("**No check's outcome changed between runs.**")
    else:
        lines += [f"## {len(report['unstable'])} unstable checks", ""]
        for u in report["unstable"]:
            lines.append(f"- `{u['target']}` `{u['check']}`")
            for run, o in u["outcomes"].items():
                lines.append(f"  - run {run}: {o['outcome']} {_first_line(o['reason'])}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-flakes",
        description="run the main job under varied threads, orders and groupings, and list "
        "every check whose outcome changed",
    )
    parser.add_argument(
        "--target",
        action="append",
        dest="targets",
        help="a target to hunt on (repeatable; default: every available target)",
    )
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help=f"runs (default: {DEFAULT_RUNS})"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the hunt's seed (default: a fresh one)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if args.runs < 2:
        print(
            f"nemotron-vl-flakes: error: --runs: expected at least 2, got {args.runs}",
            file=sys.stderr,
        )
        return 2
    targets = args.targets or available_targets()
    for target in targets:
        try:
            resolve_target(target)
        except TargetLoadError as e:
            print(f"nemotron-vl-flakes: error: {e}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(args.runs, seed, os.cpu_count() or 1)
    # SIGTERM (a CI job cancelled) unwinds as Ctrl-C does: the running main job is stopped
    # and the warm servers are retired.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    outcomes, warm = run_hunt(targets, runs, out, extra)
    command = "nemotron-vl-flakes " + shlex.join(
        [*(f"--target={t}" for t in targets), f"--runs={args.runs}", f"--seed={seed}"]
        + (["--", *extra] if extra else [])
    )
    report = hunt_report(seed, targets, outcomes, command, warm)
    replace_text(out / "flakes.json", json.dumps(report, indent=1) + "\n")
    replace_text(out / "flakes.md", render_markdown(report))
    print(render_markdown(report))
    print(f"flake hunt report: {out / 'flakes.md'} and flakes.json")
    if any(o.problems for o in outcomes):
        return 2  # as the main job's: an incomplete run comes first (its unstable checks listed)
    return 1 if report["unstable"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
