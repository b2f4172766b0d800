"""The lint survey: robustness over large real trees, every finding on them reviewed, speed.

    no-tensor-truthiness-survey [--out reports] [--rounds 3]

1. Robustness: the checker over every file of the installed ``vllm``, ``torch`` and
   ``transformers`` packages and the Python standard library (no prefilter: all parsed):
   files, findings, unparseable files, internal errors (must be 0: an internal error is a crash
   the checker caught).
2. Every finding on vllm, torch and transformers (as a user's run finds them), joined with its
   verdict in ``fixtures/lint/survey_verdicts.toml`` (real risk, annotation wrong or false
   positive, and why); the precision those verdicts give.
3. Speed, each a fresh process, median of ``--rounds``: the models folder and the whole vllm
   package cold (no cache), the whole package again with a warm cache, and ``ruff check
   --select E,F`` on the same files in the same run (ruff skips ``site-packages``, so both tools
   read a copy of the package).

Writes ``<out>/lint-survey.md`` and ``<out>/lint-survey.json``; exit status 1 when a target is
missed (internal errors, findings without a verdict, verdicts without a finding, or speed).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from no_tensor_truthiness.config import LintConfig
from no_tensor_truthiness.rules import ALWAYS_REPORTED, FILE_NOT_CHECKED, INTERNAL_ERROR
from no_tensor_truthiness.runner import discover, run

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = ROOT / "fixtures" / "lint" / "survey_verdicts.toml"
REVIEWED_TREES = ("vllm", "torch", "transformers")
VERDICT_CLASSES = ("real risk", "annotation wrong", "false positive")
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
                "findings": sum(f.code not in ALWAYS_REPORTED for f in result.findings),
                "unparseable": s.errors,
                "internal_errors": s.internal_errors,
                "crash": crashed,
                "seconds": round(time.perf_counter() - start, 2),
                "internal_error_examples": [
                    f.format() for f in result.findings if f.code == INTERNAL_ERROR
                ][:5],
            }
        )
    return rows


def load_verdicts(path: Path = VERDICTS) -> dict[str, Any]:
    """The fixture: ``versions`` it was reviewed on and one ``finding`` table per finding."""
    data = tomllib.loads(path.read_text())
    for i, entry in enumerate(data.get("finding", [])):
        missing = {"tree", "path", "code", "source", "verdict", "reason"} - set(entry)
        if missing:
            raise ValueError(f"{path}: finding {i}: missing keys {sorted(missing)}")
        if entry["verdict"] not in VERDICT_CLASSES:
            raise ValueError(
                f"{path}: finding {i} ({entry['path']}): verdict: expected one of "
                f"{VERDICT_CLASSES}, got {entry['verdict']!r}"
            )
    return data


def installed_versions() -> dict[str, str]:
    versions = {}
    for name in REVIEWED_TREES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def reviewed_findings(trees: dict[str, Path]) -> dict[str, Any]:
    """Every finding on the reviewed trees (a user's run: prefilter on), each joined with its
    verdict by (path, code, stripped source line) so verdicts survive line shifts; verdicts
    that no longer match a finding are returned as stale."""
    verdicts = load_verdicts()
    pending: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in verdicts.get("finding", []):
        pending.setdefault((entry["path"], entry["code"], entry["source"]), []).append(entry)
    rows = []
    for tree in REVIEWED_TREES:
        if tree not in trees:
            continue
        root = trees[tree].parent
        result = run(discover([trees[tree]], LintConfig()), LintConfig(), display_root=root)
        for f in result.findings:
            if f.code in ALWAYS_REPORTED:
                continue
            source = (root / f.path).read_text().splitlines()[f.line - 1].strip()
            matches = pending.get((f.path, f.code, source), [])
            verdict = matches.pop(0) if matches else None
            rows.append(
                {
                    "tree": tree,
                    "finding": f.format(),
                    "path": f.path,
                    "code": f.code,
                    "source": source,
                    "verdict": verdict["verdict"] if verdict else "unreviewed",
                    "reason": verdict["reason"] if verdict else "",
                }
            )
    stale = [e for entries in pending.values() for e in entries if e["tree"] in trees]
    return {
        "reviewed_on": verdicts.get("versions", {}),
        "installed": installed_versions(),
        "findings": rows,
        "stale_verdicts": stale,
        "precision": precision(rows),
    }


def precision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree and in all: counts per verdict, and the share of findings that are real risks
    (strict) or real risks and wrong annotations (the lint right given the annotations)."""

    def summary(selected: list[dict[str, Any]]) -> dict[str, Any]:
        counts = Counter(r["verdict"] for r in selected)
        total = len(selected)
        real, annotated = counts["real risk"], counts["annotation wrong"]
        return {
            "findings": total,
            **{c: counts[c] for c in (*VERDICT_CLASSES, "unreviewed")},
            "precision": round(real / total, 3) if total else None,
            "precision_given_annotations": round((real + annotated) / total, 3) if total else None,
        }

    out = {tree: summary([r for r in rows if r["tree"] == tree]) for tree in REVIEWED_TREES}
    out["all"] = summary(rows)
    return out


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
    lint = [sys.executable, "-m", "no_tensor_truthiness.cli", "--exit-zero"]
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
        ruff = _ruff()
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


def _ruff() -> str | None:
    """The ruff binary: on PATH, or the one the ``ruff`` package installed beside Python."""
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.is_file() else shutil.which("ruff")


def render(data: dict[str, Any]) -> str:
    lines = [
        "# no-tensor-truthiness survey",
        "",
        f"Generated {data['generated']} by `nox -s lint-survey` "
        f"(`no-tensor-truthiness-survey`); {data['cpus']} cores.",
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
        f"Unparseable files are reported as one `{FILE_NOT_CHECKED}` each (e.g. test data "
        f"written in Python 2 syntax); an internal error would be a `{INTERNAL_ERROR}`.",
        "",
        "## Every finding on vllm, torch and transformers, reviewed",
        "",
        "Verdicts from `fixtures/lint/survey_verdicts.toml` (reviewed on "
        + ", ".join(f"{k} {v}" for k, v in data["review"]["reviewed_on"].items())
        + "): **real risk** (fix the code), **annotation wrong** (the lint believed an "
        "annotation that does not hold; the message names it), **false positive**.",
        "",
        "| tree | findings | real risk | annotation wrong | false positive | unreviewed "
        "| precision | given annotations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tree, p in data["review"]["precision"].items():
        lines.append(
            f"| {tree} | {p['findings']} | {p['real risk']} | {p['annotation wrong']} | "
            f"{p['false positive']} | {p['unreviewed']} | {p['precision']} | "
            f"{p['precision_given_annotations']} |"
        )
    lines.append("")
    for f in data["review"]["findings"]:
        lines += [
            f"- `{f['finding']}`",
            f"  - **{f['verdict']}**: {f['reason']}",
        ]
    for stale in data["review"]["stale_verdicts"]:
        lines.append(f"- stale verdict (no such finding): `{stale['path']}` `{stale['source']}`")
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
    parser = argparse.ArgumentParser(prog="no-tensor-truthiness-survey")
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
    data: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "robustness": robustness(trees),
        "review": reviewed_findings(trees),
        "speed": speed(trees["vllm"], args.rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lint-survey.json").write_text(json.dumps(data, indent=2) + "\n")
    text = render(data)
    (args.out / "lint-survey.md").write_text(text)
    print(text)
    ok = all(not r.get("crash") and r["internal_errors"] == 0 for r in data["robustness"])
    ok &= all(f["verdict"] != "unreviewed" for f in data["review"]["findings"])
    ok &= not data["review"]["stale_verdicts"]
    ok &= all(data["speed"][k] < v for k, v in TARGETS_S.items())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
