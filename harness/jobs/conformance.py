"""The main job: run the conformance suites against each target and write one report.

    nemotron-vl-conformance [--target T ...] [--device cpu|cuda] [--out reports] [--jobs N]
                            [--groups N] [--rerun [TARGET ...]] [-- extra pytest arguments]

Without ``--target``, every available target runs: ``reference``, ``vllm`` when vLLM is
installed, and ``vllm-engine`` when the CPU build's environment exists (its checks,
``suites/engine``, run with that environment's Python: :mod:`harness.jobs.runtimes`). Each target
runs in its own pytest process (a ``vllm-file:`` target replaces modules
in ``sys.modules``, so targets never share a process), writing JUnit XML and per-check results;
the report merges them into ``<out>/conformance.md`` and ``.json``. The targets run side by side,
as many at once as there are cores (``--jobs N``; 1: one after the other), each with its share
of the cores for torch's threads (``OMP_NUM_THREADS``, unless set), and a process that ends
hands its cores to those still running (:mod:`harness.jobs.cores`); each line of their output
then starts with the target's name. Where there are more cores than targets, each target's
checks also spread over ``--groups N`` processes at once, each a group of whole modules (so a
process builds each model its modules need once; :mod:`harness.plugin.groups`), their results
merged into the target's: the same checks, the same outcomes.

A target whose last clean run's inputs are all unchanged (every file its processes imported,
the fixtures, the options and the environment; :mod:`harness.jobs.kept`) is not run again: its
kept outcomes are the report's, and the report says so; ``--rerun`` runs every target,
``--rerun TARGET ...`` those named.

Each process is supervised (:mod:`harness.jobs.supervisor`): a check has a time limit
(``--check-timeout SECONDS``), the process group a memory limit (``--memory-limit GIB``); a check
past either FAILs and the suites go on from the next check in a new process, as they do after a
crash (at most ``--max-restarts`` times per target). Ctrl-C or SIGTERM stops the run and still
writes the report.

Exit status: 0 every check passed or failed as a known deviation; 1 a check failed (a time or
memory limit included); 2 the run is incomplete: a bad option, a target that failed to load or
crashed, restarts that ran out, an interrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import math
import os
import re
import shlex
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.cores import CoreShare, cores_shared
from harness.jobs.forkserver import ForkServer
from harness.jobs.kept import KeptOutcomes, imports_path, options_key, read_imports
from harness.jobs.report import TargetRun, build_report, exit_status, verdict, write_report
from harness.jobs.results import (
    ResultsError,
    TargetStatus,
    merge_groups,
    read_results,
    write_results,
)
from harness.jobs.runtimes import (
    CORES_BIND_ENV,
    ENGINE_CHECK_TIMEOUT_S,
    ENGINE_TARGET,
    RuntimeMissing,
    available_cores,
    engine_python,
    group_cores,
    runtime_of,
)
from harness.jobs.supervisor import (
    DEFAULT_CHECK_TIMEOUT_S,
    DEFAULT_DERIVED_LIMIT_FACTOR,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MEMORY_LIMIT_GIB,
    DERIVED_LIMIT_FLOOR_S,
    Interrupt,
    Limits,
    Supervisor,
    merge_supervised,
)
from harness.jobs.warm import add_keep_warm_option, job_fork_servers, retire_all


def available_targets() -> list[str]:
    targets = ["reference"]
    try:
        metadata.version("vllm")
        targets.append("vllm")
    except metadata.PackageNotFoundError:
        pass
    if engine_python() is not None:
        targets.append(ENGINE_TARGET)
    return targets


def slug(selector: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", selector).strip("-")[:60]


def run_target(
    selector: str,
    device: str,
    out_dir: Path,
    extra: list[str],
    limits: Limits,
    interrupt: Interrupt,
    label: str = "",
    groups: int = 1,
    cores: CoreShare | None = None,
    fork_server: ForkServer | None = None,
    split_suites: bool = True,
) -> TargetRun:
    """One target's suites, supervised; with ``groups`` > 1, as that many groups of whole
    modules (``--check-group K/N``), or one group per suite for a target whose runtime says so
    (:attr:`TargetRuntime.suite_groups`), each in its own supervised processes, side by side,
    their results merged into the target's. Its processes are forked from ``fork_server`` if
    given; ``split_suites`` False: groups of modules only (the caller's ``--groups``)."""
    groups = target_groups(selector, groups, extra, split_suites)
    results_path = out_dir / f"results-{slug(selector)}.json"
    results_path.unlink(missing_ok=True)
    run_group = functools.partial(
        _run_group,
        selector,
        device,
        out_dir,
        extra,
        limits,
        interrupt,
        cores=cores,
        fork_server=fork_server,
    )
    if groups == 1:
        return run_group(label, None)
    with ThreadPoolExecutor(max_workers=groups) as pool:
        parts = list(
            pool.map(
                lambda k: run_group(f"{label or selector} {k}/{groups}", (k, groups)),
                range(1, groups + 1),
            )
        )
    supervised = merge_supervised([p.supervised for p in parts if p.supervised is not None])
    missing = [
        f"group {k}/{groups}: {p.problem}" for k, p in enumerate(parts, 1) if p.results is None
    ]
    if missing:
        return TargetRun(
            selector,
            supervised.exit_status,
            None,
            problem="; ".join(missing),
            supervised=supervised,
        )
    results = merge_groups([p.results for p in parts if p.results is not None])
    write_results(results_path, results)
    merge_junit(
        [
            out_dir / f"junit-{slug(selector)}-group-{k}-of-{groups}.xml"
            for k in range(1, groups + 1)
        ],
        out_dir / f"junit-{slug(selector)}.xml",
    )
    return TargetRun(selector, supervised.exit_status, results, supervised=supervised)


def target_groups(selector: str, groups: int, extra: list[str], split_suites: bool = True) -> int:
    """How many groups a target runs as, given ``groups``: one per suite for a target whose
    suites run as groups, where there is more than one core (its processes then bind to cores
    of their own), unless the pytest arguments ``extra`` name a path (pytest would add its
    checks to each suite's process: they would run twice) or ``split_suites`` is False."""
    runtime = runtime_of(selector)
    # An option's value that is a path counts too: one group is the safe side of a guess.
    names_a_path = any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in extra)
    if (
        split_suites
        and runtime.suite_groups
        and len(runtime.suites) > 1
        and len(available_cores()) > 1
        and not names_a_path
    ):
        return len(runtime.suites)
    return groups


def target_limits(
    targets: list[str], limits: Limits, *, caller_set_timeout: bool
) -> dict[str, Limits]:
    """Each target's limits: ``limits``, with the target's own check limit where it has one (the
    engine target's checks start vLLM's processes) unless the caller set ``--check-timeout``."""
    found = {}
    for target in targets:
        own = runtime_of(target).check_timeout_s
        if own is None or caller_set_timeout:
            found[target] = limits
        else:
            found[target] = dataclasses.replace(limits, check_timeout_s=own)
    return found


def merge_junit(parts: list[Path], out: Path) -> None:
    """The groups' JUnit files as the target's one: their ``<testsuite>`` elements under one
    ``<testsuites>`` (a file a group never wrote, or cannot be read, is left out; its checks are
    in the results and the report)."""
    root = ElementTree.Element("testsuites")
    for part in parts:
        try:
            tree = ElementTree.parse(part)
        except (OSError, ElementTree.ParseError):
            continue
        top = tree.getroot()
        root.extend([top] if top.tag == "testsuite" else list(top))
    ElementTree.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)


def process_name(selector: str, group: tuple[int, int] | None) -> str:
    """The name of a target's process (or of one group's) in its files' names."""
    return slug(selector) + (f"-group-{group[0]}-of-{group[1]}" if group else "")


def _run_group(
    selector: str,
    device: str,
    out_dir: Path,
    extra: list[str],
    limits: Limits,
    interrupt: Interrupt,
    label: str,
    group: tuple[int, int] | None,
    cores: CoreShare | None = None,
    fork_server: ForkServer | None = None,
) -> TargetRun:
    """One supervised pytest process (and its restarts) for a target, or for one group of its
    checks; its cores handed to the others when it ends (``cores``)."""
    name = process_name(selector, group)
    runtime = runtime_of(selector)
    suites, selection = runtime.suites, [f"--check-group={group[0]}/{group[1]}"] if group else []
    env: dict[str, str] = {}
    if runtime.suite_groups and group:
        suites, selection = (runtime.suites[group[0] - 1],), []
        if CORES_BIND_ENV not in os.environ:  # a binding the caller set stands
            env[CORES_BIND_ENV] = group_cores(group, available_cores())
    results_path = out_dir / f"results-{name}.json"
    progress_path = out_dir / f".progress-{name}"
    results_path.unlink(missing_ok=True)

    def command(resume: bool) -> list[str]:
        # A resumed process writes its own JUnit file: the first one's is kept whole.
        junit = out_dir / f"junit-{name}{'-resumed' if resume else ''}.xml"
        return [
            runtime.python,
            "-m",
            "pytest",
            *suites,
            f"--target={selector}",
            f"--device={device}",
            f"--results-json={results_path}",
            f"--progress-file={progress_path}",
            f"--junitxml={junit}",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfEX",
            # Python's own tracebacks: pytest's long ones parse every frame's whole source file,
            # a fifth of the vLLM target's time with its 125 known deviations (measured: 22 s of
            # 138 s); its collections of the garbage at exit take 3.7 s of a process holding vLLM.
            "--tb=native",
            "-p",
            "no:unraisableexception",
            *selection,
            *([f"--core-share-file={cores.path}"] if cores else []),
            *(["--resume"] if resume else []),
            *extra,
        ]

    shown = "".join(f"{k}={v} " for k, v in env.items()) + shlex.join(command(False))
    print(f"\n=== conformance: {label or selector} ===\n$ {shown}", flush=True)
    with cores.held() if cores is not None else contextlib.nullcontext():
        supervised = Supervisor(
            command,
            results=results_path,
            progress=progress_path,
            limits=limits,
            cwd=ROOT,
            interrupt=interrupt,
            label=label,
            fork_server=fork_server,
            env=env,
        ).run()
    progress_path.unlink(missing_ok=True)
    status = supervised.exit_status
    if not results_path.is_file():
        return TargetRun(
            selector,
            status,
            None,
            problem=f"pytest exited {status} before writing results: {supervised.last_words}",
            supervised=supervised,
        )
    try:
        results = read_results(results_path)
    except ResultsError as e:
        return TargetRun(selector, status, None, problem=str(e), supervised=supervised)
    return TargetRun(selector, status, results, supervised=supervised)


def reuse_kept(
    kept: KeptOutcomes, selector: str, options: dict[str, Any], out_dir: Path
) -> TargetRun | None:
    """The target's kept run as this run's, its files written into ``out_dir`` as a run writes
    them; None (and why, on the console) when it must run."""
    found, why = kept.lookup(options)
    if found is None:
        if kept.folder is not None:
            print(f"=== conformance: {selector} runs: {why} ===", flush=True)
        return None
    name = slug(selector)
    write_results(out_dir / f"results-{name}.json", found.results)
    (out_dir / f"junit-{name}.xml").write_text(found.junit)
    print(
        f"=== conformance: {selector}: reusing the outcomes of its run that ended at "
        f"{found.kept_at}: "
        "nothing they came from has changed (--rerun runs it) ===",
        flush=True,
    )
    return TargetRun(
        selector,
        found.results["exit_status"] or 0,
        found.results,
        reused={"kept_at": found.kept_at, "wall_s": found.wall_s},
    )


def keep_clean_run(
    kept: KeptOutcomes,
    options: dict[str, Any],
    run: TargetRun,
    out_dir: Path,
    groups: int,
    extra: list[str],
    split_suites: bool = True,
) -> None:
    """Keep a target's run for reuse if it is clean: complete, every check passed or failed as
    a known deviation, no incident and no restart, and every process recorded its imports."""
    if kept.folder is None or run.results is None or run.supervised is None:
        return
    if verdict(run).status is not TargetStatus.OK or not run.results["complete"]:
        return
    if run.supervised.incidents or run.supervised.restarts:
        return
    groups = target_groups(run.selector, groups, extra, split_suites)
    parts = [None] if groups == 1 else [(k, groups) for k in range(1, groups + 1)]
    imported = read_imports(
        imports_path(out_dir / f"results-{process_name(run.selector, part)}.json") for part in parts
    )
    junit = out_dir / f"junit-{slug(run.selector)}.xml"
    if imported is None or not junit.is_file():
        return
    kept.keep(options, run.results, junit.read_text(), imported, run.supervised.wall_s)


def split_pytest_args(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """A command line's own arguments and the pytest arguments after ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_pytest_args(argv)
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-conformance", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--target",
        action="append",
        dest="targets",
        help="a target to run (repeatable); default: every available target",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports", help="report folder (default: reports/)"
    )
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"time limit of each check, set-up included (default: {DEFAULT_CHECK_TIMEOUT_S:g}; "
        f"the engine target's checks, which start vLLM's processes, {ENGINE_CHECK_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        default=DEFAULT_MEMORY_LIMIT_GIB,
        metavar="GIB",
        help="resident memory limit of a target's processes, in GiB "
        f"(default: {DEFAULT_MEMORY_LIMIT_GIB:g})",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        metavar="N",
        help="restarts per target after a fault (timeout, memory, crash) before the checks "
        f"left are given up (default: {DEFAULT_MAX_RESTARTS})",
    )
    parser.add_argument(
        "--derived-limit-factor",
        type=float,
        default=DEFAULT_DERIVED_LIMIT_FACTOR,
        metavar="X",
        help="after a check times out, each later check's limit is X times the slowest honest "
        f"check seen, at least {DERIVED_LIMIT_FLOOR_S:g} s and at most --check-timeout "
        f"(default: {DEFAULT_DERIVED_LIMIT_FACTOR:g})",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=None,
        metavar="N",
        help="processes per target, each running a group of whole modules at the same time "
        "(default: the cores left over per target, at least 1)",
    )
    parser.add_argument(
        "--rerun",
        nargs="*",
        default=None,
        metavar="TARGET",
        help="run these targets (none named: every target) even where their kept outcomes are "
        "current (harness/jobs/kept.py)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="targets run at the same time, each in its own supervised processes (default: "
        "as many as there are targets and cores)",
    )
    parser.add_argument(
        "--no-fork-server",
        dest="fork_server",
        action="store_false",
        help="start each target process as a new Python (default on CPU: fork each from a "
        "server that imported torch, and vLLM for vLLM's targets, once; "
        "harness/jobs/forkserver.py)",
    )
    add_keep_warm_option(parser, "the fork servers this run starts")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    for flag, value in (("--jobs", args.jobs), ("--groups", args.groups)):
        if value is not None and value < 1:
            print(
                f"nemotron-vl-conformance: error: {flag}: expected at least 1, got {value}",
                file=sys.stderr,
            )
            return 2
    if args.keep_warm is not None and not 0 <= args.keep_warm < math.inf:  # NaN included
        print(
            "nemotron-vl-conformance: error: --keep-warm: expected minutes, at least 0 and "
            f"finite, got {args.keep_warm:g}",
            file=sys.stderr,
        )
        return 2
    try:
        limits = Limits(
            DEFAULT_CHECK_TIMEOUT_S if args.check_timeout is None else args.check_timeout,
            args.memory_limit,
            args.max_restarts,
            args.derived_limit_factor,
        )
    except ValueError as e:
        option = {
            "check_timeout_s": "--check-timeout",
            "memory_limit_gib": "--memory-limit",
            "max_restarts": "--max-restarts",
            "derived_limit_factor": "--derived-limit-factor",
        }
        message = str(e)
        for field_name, flag in option.items():
            message = message.replace(f"Limits.{field_name}", flag)
        print(f"nemotron-vl-conformance: error: {message}", file=sys.stderr)
        return 2
    targets = args.targets or available_targets()
    for selector in targets:
        try:
            runtime_of(selector)
        except RuntimeMissing as e:
            print(f"nemotron-vl-conformance: error: --target: {e}", file=sys.stderr)
            return 2
    unknown = [t for t in args.rerun or [] if t not in targets]
    if unknown:
        print(
            f"nemotron-vl-conformance: error: --rerun: expected targets of this run "
            f"({', '.join(targets)}), got {', '.join(unknown)}",
            file=sys.stderr,
        )
        return 2
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # The report reads the checkpoint catalogue (torch and transformers: 6 s of imports on 2
    # cores): imported while the targets run, not after them.
    threading.Thread(
        target=importlib.import_module, args=("harness.checkpoints.pairs",), daemon=True
    ).start()
    # A target run again (--rerun) still has its clean run kept, for the next main job.
    kept = KeptOutcomes.from_environment()
    limits_of = target_limits(targets, limits, caller_set_timeout=args.check_timeout is not None)
    rerun = set(targets) if args.rerun == [] else set(args.rerun or [])
    options = {
        t: {**options_key(t, args.device, extra, limits_of[t]), "python": runtime_of(t).python}
        for t in targets
    }
    reused = {
        t: r for t in targets if t not in rerun and (r := reuse_kept(kept, t, options[t], out_dir))
    }
    to_run = [t for t in targets if t not in reused]
    cores = os.cpu_count() or 1
    jobs = args.jobs or max(1, min(len(to_run), cores))
    groups = args.groups or max(1, cores // jobs)
    split = args.groups is None  # a --groups N given is every target's, the engine's too
    # Every target's processes, restarts included, read the checkpoint folders written once,
    # and are forked from a server that imported torch (and vLLM) once.
    # Not on CUDA: forking a process that may have touched the device is not supported there.
    forked = args.fork_server and args.device == "cpu"
    fork_kinds = {t: runtime_of(t).fork_kind for t in targets}
    kinds = [k for t in to_run if (k := fork_kinds[t]) is not None] if forked else []
    keep_warm = args.keep_warm
    if keep_warm == 0:
        for line in retire_all() or ["no warm server to retire"]:
            print(f"=== fork servers: {line} ===", flush=True)
        keep_warm = None
    elif keep_warm is not None and not forked:
        why = "--no-fork-server" if not args.fork_server else f"--device {args.device}"
        print(f"=== fork servers: none ({why}), so none kept warm ===", flush=True)
    with (
        shared_folders(),
        Interrupt().installed() as interrupt,
        cores_shared(jobs * groups, cores) as cores_share,
        job_fork_servers(kinds, keep_warm) as servers,
    ):

        def run(selector: str) -> TargetRun:
            if selector in reused:
                return reused[selector]
            if interrupt:
                return TargetRun(selector, 2, None, problem="not run: the run was interrupted")
            label = selector if jobs > 1 else ""  # interleaved output says whose it is
            done = run_target(
                selector,
                args.device,
                out_dir,
                extra,
                limits_of[selector],
                interrupt,
                label,
                groups,
                cores=cores_share,
                fork_server=servers.get(fork_kinds[selector] or ""),
                split_suites=split,
            )
            if not interrupt:
                keep_clean_run(kept, options[selector], done, out_dir, groups, extra, split)
            return done

        # The targets' processes are independent: side by side they share the cores, and the
        # results are the same as one after the other.
        # The longest first: a target whose suites run as groups (the engine target, longer
        # than the others together) starts at once, not after one of them has ended.
        order = sorted(targets, key=lambda t: not runtime_of(t).suite_groups)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            started = {t: pool.submit(run, t) for t in order}
            runs = [started[t].result() for t in targets]
    command = "nemotron-vl-conformance " + shlex.join(argv + (["--", *extra] if extra else []))
    report = build_report(runs, command=command.strip())
    json_path, md_path = write_report(report, out_dir)
    status = exit_status(report)
    print(f"\nconformance report: {md_path} and {json_path.name}; exit status {status}")
    for t in report["targets"]:
        s = t["summary"]
        print(
            f"  {t['selector']}: {t['status']} — {s['pass']} pass, {s['xfail']} expected-fail, "
            f"{s['fail']} fail, {s['xpass']} unexpected pass, {s['error']} error, {s['skip']} skip"
            + (f" ({t['problem']})" if t["problem"] else "")
        )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
