"""The main job: run the conformance suites against each target and write one report.

    python -m harness.conformance [--target T ...] [--device cpu|cuda] [--out reports]
                                  [-- extra pytest arguments]

Without ``--target``, every available target runs: ``reference``, and ``vllm`` when vLLM is
installed. Each target runs in its own pytest process (a ``vllm-file:`` target replaces modules
in ``sys.modules``, so targets never share a process), writing JUnit XML and per-check results;
the report merges them into ``<out>/conformance.md`` and ``.json``.

Exit status: 0 every check passed or failed as a known deviation, 1 a check failed, 2 the harness
could not run (a bad option, a target that failed to load).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

from harness import ROOT
from harness.report import TargetRun, build_report, exit_status, write_report
from harness.results import ResultsError, read_results

SUITE = "suites/conformance"


def available_targets() -> list[str]:
    from importlib import metadata

    targets = ["reference"]
    try:
        metadata.version("vllm")
        targets.append("vllm")
    except metadata.PackageNotFoundError:
        pass
    return targets


def slug(selector: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", selector).strip("-")[:60]


def run_target(selector: str, device: str, out_dir: Path, extra: list[str]) -> TargetRun:
    results_path = out_dir / f"results-{slug(selector)}.json"
    results_path.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        SUITE,
        f"--target={selector}",
        f"--device={device}",
        f"--results-json={results_path}",
        f"--junitxml={out_dir / f'junit-{slug(selector)}.xml'}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEX",
        *extra,
    ]
    print(f"\n=== conformance: {selector} ===\n$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    if not results_path.is_file():
        return TargetRun(
            selector,
            proc.returncode,
            None,
            problem=f"pytest exited {proc.returncode} before writing results",
        )
    try:
        results = read_results(results_path)
    except ResultsError as e:
        return TargetRun(selector, proc.returncode, None, problem=str(e))
    problem = ""
    if proc.returncode not in (0, 1):
        problem = f"pytest exited {proc.returncode} (the harness could not run this target)"
    elif not results["checks"]:
        problem = "no conformance checks ran"
    return TargetRun(selector, proc.returncode, results, problem)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m harness.conformance", description=__doc__.splitlines()[0]
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    targets = args.targets or available_targets()
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [run_target(t, args.device, out_dir, extra) for t in targets]
    command = "python -m harness.conformance " + shlex.join(
        argv + (["--", *extra] if extra else [])
    )
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
