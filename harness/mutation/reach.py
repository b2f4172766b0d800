"""Which checks execute which lines of the model's vLLM code: the mutation score's scope, measured.

The scope is every function of the model family's files (:data:`SCOPE`): the VL model, its
processor module, RADIO, Parakeet, the EVS helpers, and NemotronH's config and loading code. What
the suites reach of it is measured, not listed: the conformance suites run once against the
installed vLLM under coverage.py, with one coverage context per check, and the result is a map
from each line to the checks that executed it (:class:`Reach`).

A model is built once per process and shared by every check that asks for the same one, so the
constructor's and the loader's lines run in the first such check only. The measurement therefore
runs each build under a context of its own, records which checks asked for which build, and
counts a build's lines as executed by every check that used it: a mutant of ``load_weights`` runs
against every check that reads the loaded weights, not just the one that happened to build them.
A function cached with functools (Parakeet's mel filters and window) is the same case: its body
runs once per process, so the measurement empties such caches as each check starts.

    nemotron-vl-reach [--out reports/mutation-reach.json] [--suites PATH ...]

Functions vLLM wraps in ``torch.compile`` (the processor's resize and normalisation, Parakeet's
mel steps) run as a graph traced from their source, and coverage.py never sees a traced line run:
measured as they are served, they would look unreached and their mutants would count as survivors
without a run. The map is therefore measured with compilation off (:data:`MEASURING_ENV`): their
lines run as Python, the same lines the graph is traced from, under the checks that call them.

The map is written with a fingerprint of what it depends on (the installed scope files, the
suites, the harness, how it was measured); the mutation score measures it again when the
fingerprint changed.
Measuring takes one run of the conformance suites against vLLM under coverage (about 3 minutes
on a 2-core machine).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.model_files import (
    EVS_FILE,
    MODEL_FILE,
    NEMOTRON_H_FILE,
    PARAKEET_FILE,
    PROCESSOR_FILE,
    RADIO_FILE,
    installed_file,
)
from harness.mutation.unreached import Explanation

REACH_FILE = ROOT / "reports" / "mutation-reach.json"
#: The unreached lines and why, written beside the map by ``nemotron-vl-reach``.
UNREACHED_REPORT = "unreached.md"
SUITES = ("suites/conformance",)
#: What the map depends on besides the installed files (what the checks run): a change here
#: measures it again. The jobs, the mutation tools and the GPU checks are not on that path.
FINGERPRINTED_TREES = ("suites/conformance", "harness", "fixtures", "reference_impl")
UNFINGERPRINTED = (
    "harness/jobs",
    "harness/mutation",
    "harness/gpu",
    "fixtures/mutation_survivors.toml",
    "fixtures/unreached.toml",
    "fixtures/config_fields.toml",
)
#: The measuring process's environment, over the caller's (see the module's docstring).
MEASURING_ENV = {"TORCH_COMPILE_DISABLE": "1"}
#: How the map is measured: part of its fingerprint, so that a map measured otherwise is measured
#: again.
METHOD = (
    "coverage.py, a context per check and per model build; functools caches emptied per check; "
    "traced lines credited to their statement's first line too; "
    + repr(sorted(MEASURING_ENV.items()))
)


@dataclass(frozen=True)
class ScopeFile:
    """One file of the scope: every function in it but those named in ``excluded`` (with why)."""

    file: Path  # relative to site-packages
    excluded: frozenset[str] = frozenset()
    why_excluded: str = ""


#: NemotronH's serving path (its forward, logits and embedding lookup) runs in the engine's
#: forward pass, which the suites do not drive on CPU; its config and loading code is in scope.
LM_SERVING_PATH = frozenset({"forward", "compute_logits", "embed_input_ids"})
SCOPE: tuple[ScopeFile, ...] = (
    ScopeFile(MODEL_FILE),
    ScopeFile(PROCESSOR_FILE),
    ScopeFile(RADIO_FILE),
    ScopeFile(PARAKEET_FILE),
    ScopeFile(EVS_FILE),
    ScopeFile(
        NEMOTRON_H_FILE,
        LM_SERVING_PATH | {"update_physical_experts_metadata"},
        "the language model's serving path (the engine's forward pass and expert load "
        "balancing), which no CPU check drives: the scope is NemotronH's config and loading code",
    ),
)


@dataclass(frozen=True)
class ScopeFunction:
    """A function of the scope and the lines of its body (nested functions included)."""

    file: Path
    qualname: str
    first_line: int
    last_line: int

    @property
    def name(self) -> str:
        return f"{self.file}:{self.qualname}"


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and the methods of classes (nested classes too), by qualname."""

    def walk(
        body: list[ast.stmt], prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + node.name, node
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(tree.body, "")


def functions_in_scope(scope: tuple[ScopeFile, ...] = SCOPE) -> list[ScopeFunction]:
    """Every function of the scope in the installed vLLM, file by file, in source order."""
    out: list[ScopeFunction] = []
    for entry in scope:
        tree = ast.parse(installed_file(entry.file).read_text())
        for qualname, node in _functions(tree):
            if qualname.rsplit(".", 1)[-1] in entry.excluded:
                continue
            body_start = node.body[0].lineno
            end = node.end_lineno if node.end_lineno is not None else body_start
            out.append(ScopeFunction(entry.file, qualname, body_start, end))
    return out


def fingerprint(suites: tuple[str, ...] = SUITES, scope: tuple[ScopeFile, ...] = SCOPE) -> str:
    """A digest of what the map depends on: the suites it ran, the installed scope files and
    our trees."""
    digest = hashlib.sha256(repr(suites).encode())
    digest.update(METHOD.encode())
    for entry in scope:
        digest.update(str(entry.file).encode())
        digest.update(installed_file(entry.file).read_bytes())
    for tree in FINGERPRINTED_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(UNFINGERPRINTED) or "__pycache__" in path.parts:
                continue
            if path.is_file():
                digest.update(relative.encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


#: The coverage context of a model build: ``build:N``, N the build's index.
BUILD = "build:"


def attribute_lines(
    contexts_by_line: Mapping[int, Collection[str]],
    index: Mapping[str, int],
    users: Mapping[int, Collection[str]],
) -> dict[int, list[int]]:
    """Each line's checks, by index: the checks whose context executed it, and for a line a
    build executed (context ``build:N``), every check that asked for build N. Lines executed
    only outside any check (imports, collection) have none and are left out."""
    out: dict[int, list[int]] = {}
    for line, names in sorted(contexts_by_line.items()):
        found: set[int] = set()
        for name in names:
            if name in index:
                found.add(index[name])
            elif name.startswith(BUILD):
                build = int(name[len(BUILD) :])
                found |= {index[check] for check in users.get(build, ()) if check in index}
        if found:
            out[line] = sorted(found)
    return out


class ReachError(ValueError):
    """A reach file that cannot be used; the message names the file and the field."""


@dataclass
class Reach:
    """Checks by line: ``lines[file][line]`` are the indices in ``checks`` of the checks that
    executed it; ``executable[file]`` are the file's statement lines coverage.py knows."""

    fingerprint: str
    checks: list[str]
    seconds: list[float]  # each check's wall time under coverage, set-up included
    lines: dict[str, dict[int, list[int]]]
    executable: dict[str, list[int]]
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def checks_at(self, file: Path, *lines: int) -> list[str]:
        """The checks that executed any of ``lines`` of ``file``, the quickest first."""
        by_line = self.lines.get(str(file), {})
        found = sorted({i for line in lines for i in by_line.get(line, [])})
        return [self.checks[i] for i in sorted(found, key=lambda i: (self.seconds[i], i))]

    def seconds_of(self, checks: list[str]) -> float:
        index = {check: i for i, check in enumerate(self.checks)}
        return sum(self.seconds[index[c]] for c in checks)

    def reached(self, function: ScopeFunction) -> tuple[list[int], list[int]]:
        """``(reached, unreached)`` statement lines of ``function``'s body."""
        statements = [
            line
            for line in self.executable.get(str(function.file), [])
            if function.first_line <= line <= function.last_line
        ]
        by_line = self.lines.get(str(function.file), {})
        reached = [line for line in statements if by_line.get(line)]
        return reached, [line for line in statements if not by_line.get(line)]

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "meta": self.meta,
            "wall_s": self.wall_s,
            "checks": [
                {"id": c, "seconds": s} for c, s in zip(self.checks, self.seconds, strict=True)
            ],
            "files": {
                file: {
                    "executable": self.executable.get(file, []),
                    "reached": {str(line): ids for line, ids in sorted(by_line.items())},
                }
                for file, by_line in self.lines.items()
            },
        }

    @classmethod
    def from_json(cls, document: Any, where: str) -> Reach:
        try:
            checks = [str(c["id"]) for c in document["checks"]]
            seconds = [float(c["seconds"]) for c in document["checks"]]
            lines = {
                file: {int(line): [int(i) for i in ids] for line, ids in entry["reached"].items()}
                for file, entry in document["files"].items()
            }
            executable = {
                file: [int(line) for line in entry["executable"]]
                for file, entry in document["files"].items()
            }
            return cls(
                str(document["fingerprint"]),
                checks,
                seconds,
                lines,
                executable,
                float(document.get("wall_s", 0.0)),
                dict(document.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReachError(
                f"{where}: not a reach map ({type(e).__name__}: {e}); measure it again with "
                "nemotron-vl-reach"
            ) from e


def read_reach(path: Path) -> Reach:
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReachError(f"{path}: cannot read the reach map: {e}") from e
    return Reach.from_json(document, str(path))


def measure(out: Path = REACH_FILE, suites: tuple[str, ...] = SUITES) -> Reach:
    """Run ``suites`` against vLLM under coverage in a new process (the caller's own process
    stays free of built models: the mutation runner forks it) and read the map it writes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "harness.mutation.reach",
        "--in-this-process",
        "--out",
        str(out),
        "--suites",
        *suites,
    ]
    print(f"[reach] measuring what the suites reach: {' '.join(command)}", flush=True)
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **MEASURING_ENV}, check=False)
    if done.returncode != 0:
        raise ReachError(
            f"measuring the reach map failed (exit status {done.returncode}); its output is above"
        )
    reach = read_reach(out)
    print(f"[reach] measured in {time.perf_counter() - started:.0f} s: {out}", flush=True)
    return reach


def current_reach(path: Path = REACH_FILE, *, remeasure: bool = False) -> Reach:
    """The map at ``path`` when it matches what is installed and checked out, else measured
    anew (and written there)."""
    if path.is_file() and not remeasure:
        try:
            reach = read_reach(path)
        except ReachError as e:
            print(f"[reach] {e}: measuring it again", flush=True)
        else:
            if reach.fingerprint == fingerprint():
                return reach
            print(f"[reach] {path} is stale (the files it depends on changed)", flush=True)
    return measure(path)


def scope_summary(
    reach: Reach,
    functions: list[ScopeFunction],
    explanations: Sequence[Explanation] | None = None,
) -> dict[str, Any]:
    """What the map says of the scope: its files and functions, those no check reaches, the
    unreached statement lines of those reached, and why each unreached line is (the entries of
    ``fixtures/unreached.toml`` unless ``explanations`` are given)."""
    unreached: list[dict[str, Any]] = []
    partial: list[dict[str, Any]] = []
    for function in functions:
        hit, missed = reach.reached(function)
        if not hit:
            unreached.append(
                {"function": function.name, "lines": [function.first_line, function.last_line]}
            )
        elif missed:
            partial.append({"function": function.name, "reached": len(hit), "unreached": missed})
    from harness.mutation.unreached import explain, load_explanations

    missed_lines = [(f.name, reach.reached(f)[1]) for f in functions]
    explained = explain(
        [(name, lines) for name, lines in missed_lines if lines],
        load_explanations() if explanations is None else explanations,
    )
    return {
        "files": sorted({str(f.file) for f in functions}),
        "functions": len(functions),
        "unreached_lines": explained.to_json(),
        "reached_functions": len(functions) - len(unreached),
        "unreached_functions": unreached,
        "partly_reached": partial,
        "checks": len(reach.checks),
        "reach_fingerprint": reach.fingerprint,
        "reach_wall_s": reach.wall_s,
    }


def summary_lines(scope: dict[str, Any]) -> list[str]:
    """Markdown of :func:`scope_summary`: the functions no check reaches, and the lines no check
    reaches in the others."""
    unreached, partial = scope["unreached_functions"], scope["partly_reached"]
    lines = [
        f"{scope['reached_functions']} of {scope['functions']} functions in scope are reached by "
        f"at least one check; {len(unreached)} are reached by none, and {len(partial)} are "
        "reached in part.",
        "",
        "### Functions no check reaches",
        "",
    ]
    lines += [
        f"- `{f['function']}` (lines {f['lines'][0]}-{f['lines'][1]})" for f in unreached
    ] or ["(none)"]
    lines += ["", "### Lines no check reaches in the functions reached", ""]
    lines += ["| function | statements not reached | lines |", "|---|---|---|"]
    for entry in partial:
        total = entry["reached"] + len(entry["unreached"])
        lines.append(
            f"| `{entry['function']}` | {len(entry['unreached'])} of {total} | "
            f"{line_ranges(entry['unreached'])} |"
        )
    if "unreached_lines" in scope:
        from harness.mutation.unreached import report_lines

        lines += ["", *report_lines(scope["unreached_lines"])]
    return lines


def line_ranges(lines: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``3-5, 9``."""
    runs: list[list[int]] = []
    for line in lines:
        if runs and line == runs[-1][1] + 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-reach", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REACH_FILE)
    parser.add_argument(
        "--suites",
        nargs="+",
        default=list(SUITES),
        metavar="PATH",
        help="the suites to measure (default: %(default)s; the score uses only a map of those)",
    )
    # What measure() runs: the measurement itself, in a process that may build models.
    parser.add_argument("--in-this-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if args.in_this_process:
        os.environ.update(MEASURING_ENV)  # before torch is imported: it reads it once
        from harness.mutation.reach_measure import measure_here

        return measure_here(args.out.resolve(), tuple(args.suites))
    try:
        reach = measure(args.out, tuple(args.suites))
    except ReachError as e:
        print(f"nemotron-vl-reach: error: {e}", file=sys.stderr)
        return 2
    scope = write_unreached_report(reach, args.out.parent / UNREACHED_REPORT)
    print(summary_lines(scope)[0])
    print(f"unreached lines by reason: {scope['unreached_lines']['counts']}")
    return 0


def write_unreached_report(reach: Reach, out: Path) -> dict[str, Any]:
    """``out``: the scope's unreached functions and lines, each with its reason; returns the
    scope's summary."""
    scope = scope_summary(reach, functions_in_scope())
    title = "# Lines of the model's code no check reaches"
    out.write_text("\n".join([title, "", *summary_lines(scope)]) + "\n")
    return scope


if __name__ == "__main__":
    raise SystemExit(main())
