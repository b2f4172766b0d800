"""The lint survey: robustness over large real trees, the reviewed vLLM findings, and speed.

    python -m harness.lint.survey [--out reports] [--rounds 3]

1. Robustness: the checker over every file of the installed ``vllm``, ``torch`` and
   ``transformers`` packages and the Python standard library (no prefilter: all parsed):
   files, findings, unparseable files, internal errors (must be 0: an internal error is a crash
   the checker caught).
2. Every finding on the installed vLLM's ``vllm/model_executor/models/``, joined with its review
   in ``fixtures/lint/vllm_models_review.toml`` (real risk / false positive, and why).
3. Speed, each a fresh process, median of ``--rounds``: the models folder and the whole vllm
   package cold (no cache), the whole package again with a warm cache, and ``ruff check
   --select E,F`` on the same files in the same run (ruff skips ``site-packages``, so both tools
   read a copy of the package).

Writes ``<out>/lint-survey.md`` and ``<out>/lint-survey.json``; exit status 1 when a target is
missed (internal errors, unreviewed findings, or speed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from harness.lint.config import LintConfig
from harness.lint.runner import discover, run

ROOT = Path(__file__).resolve().parents[2]
REVIEW = ROOT / "fixtures" / "lint" / "vllm_models_review.toml"
TARGETS_S = {"models cold": 2.0, "vllm cold": 10.0, "vllm cached": 0.5}


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def robustness(trees: dict[str, Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, path in trees.items():
        start = time.perf_counter()
        # The standard library folder also holds site-packages: lint only the library itself.
        config = LintConfig(exclude=("site-packages",)) if name == "stdlib" else LintConfig()
        try:
            # Every file parsed and checked: robustness, not speed.
            result = run(discover([path], config), config, cache_dir=None, prefilter=False)
            crashed = ""
        except Exception as e:  # the survey reports a crash instead of dying of it
            rows.append({"tree": name, "path": str(path), "crash": f"{type(e).__name__}: {e}"})
            continue
        s = result.stats
        rows.append(
            {
                "tree": name,
                "path": str(path),
                "files": s.files,
                "parsed": s.parsed,
                "lines": s.lines,
                "findings": sum(f.code not in ("TB000", "TB999") for f in result.findings),
                "unparseable": s.errors,
                "internal_errors": s.internal_errors,
                "crash": crashed,
                "seconds": round(time.perf_counter() - start, 2),
                "internal_error_examples": [
                    f.format() for f in result.findings if f.code == "TB999"
                ][:5],
            }
        )
    return rows


def reviewed_findings(vllm: Path) -> list[dict[str, Any]]:
    """Findings on vllm/model_executor/models/, each with its review (or none)."""
    reviews = tomllib.loads(REVIEW.read_text()).get("finding", []) if REVIEW.is_file() else []
    models = vllm / "model_executor" / "models"
    result = run(
        discover([models], LintConfig()), LintConfig(), cache_dir=None, display_root=vllm.parent
    )
    rows = []
    for f in result.findings:
        source = (vllm.parent / f.path).read_text().splitlines()[f.line - 1].strip()
        review = next(
            (
                r
                for r in reviews
                if r["path"] == f.path and r["code"] == f.code and r["source"] == source
            ),
            None,
        )
        rows.append(
            {
                "finding": f.format(),
                "path": f.path,
                "code": f.code,
                "source": source,
                "class": review["class"] if review else "unreviewed",
                "reason": review["reason"] if review else "",
            }
        )
    return rows


def _time_command(cmd: list[str], rounds: int, cwd: Path) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(
            cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(vllm: Path, rounds: int) -> dict[str, float]:
    lint = [sys.executable, "-m", "harness.lint.cli", "--exit-zero"]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "vllm"
        shutil.copytree(vllm, copy, ignore=shutil.ignore_patterns("*.so", "*.pyc", "__pycache__"))
        models = copy / "model_executor" / "models"
        cache = Path(tmp) / "cache"
        out = {
            "models cold": _time_command([*lint, "--no-cache", str(models)], rounds, ROOT),
            "vllm cold": _time_command([*lint, "--no-cache", str(copy)], rounds, ROOT),
        }
        subprocess.run(
            [*lint, "--cache-dir", str(cache), str(copy)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            check=False,
        )
        out["vllm cached"] = _time_command(
            [*lint, "--cache-dir", str(cache), str(copy)], rounds, ROOT
        )
        ruff = shutil.which("ruff")
        if ruff is not None:
            base = [
                ruff,
                "check",
                "--isolated",
                "--select",
                "E,F",
                "--no-cache",
                "--exit-zero",
                "--quiet",
            ]
            out["ruff models"] = _time_command([*base, str(models)], rounds, ROOT)
            out["ruff vllm"] = _time_command([*base, str(copy)], rounds, ROOT)
    return out


def render(data: dict[str, Any]) -> str:
    lines = [
        "# no-tensor-truthiness survey",
        "",
        f"Generated {data['generated']} by `nox -s lint-survey` "
        f"(`python -m harness.lint.survey`); {data['cpus']} cores.",
        "",
        "## Robustness",
        "",
        "| tree | files | parsed | lines parsed | findings | unparseable | internal errors "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["robustness"]:
        if r.get("crash"):
            lines.append(f"| {r['tree']} | **crashed: {r['crash']}** | | | | | | |")
            continue
        lines.append(
            f"| {r['tree']} | {r['files']} | {r['parsed']} | {r['lines']} | "
            f"{r['findings']} | {r['unparseable']} | {r['internal_errors']} | "
            f"{r['seconds']} |"
        )
    lines += [
        "",
        "Unparseable files are reported as one `TB000` each (e.g. test data written "
        "in Python 2 syntax); an internal error would be a `TB999`.",
        "",
        "## Findings on vllm/model_executor/models/",
        "",
    ]
    findings = data["models_findings"]
    if not findings:
        lines.append("None.")
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["class"]] = counts.get(f["class"], 0) + 1
        lines += [
            f"- `{f['finding']}`",
            f"  - source: `{f['source']}`",
            f"  - **{f['class']}**: {f['reason']}",
        ]
    if counts:
        lines += ["", "Summary: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))]
    lines += ["", "## Speed", "", "| run | median seconds | target |", "|---|---|---|"]
    for name, seconds in data["speed"].items():
        target = TARGETS_S.get(name)
        lines.append(f"| {name} | {seconds:.3f} | {f'< {target}' if target else ''} |")
    s = data["speed"]
    if "ruff vllm" in s:
        lines += [
            "",
            f"Ratio against `ruff check --select E,F` in the same run: models "
            f"{s['models cold'] / s['ruff models']:.1f}x, whole vllm "
            f"{s['vllm cold'] / s['ruff vllm']:.1f}x (cold).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.lint.survey")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    trees = {
        name: p
        for name in ("vllm", "torch", "transformers")
        if (p := package_dir(name)) is not None
    }
    trees["stdlib"] = Path(sysconfig.get_paths()["stdlib"])
    if "vllm" not in trees:
        print("lint-survey: vLLM is not installed", file=sys.stderr)
        return 2
    import datetime
    import os

    data: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "robustness": robustness(trees),
        "models_findings": reviewed_findings(trees["vllm"]),
        "speed": speed(trees["vllm"], args.rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lint-survey.json").write_text(json.dumps(data, indent=2) + "\n")
    text = render(data)
    (args.out / "lint-survey.md").write_text(text)
    print(text)
    ok = all(not r.get("crash") and r["internal_errors"] == 0 for r in data["robustness"])
    ok &= all(f["class"] != "unreviewed" for f in data["models_findings"])
    ok &= all(data["speed"][k] < v for k, v in TARGETS_S.items())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
