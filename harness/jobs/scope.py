"""The gate's scope: the vLLM files and functions this model's checks execute, measured.

``fixtures/gate_scope.json`` is written by ``nemotron-vl-scope`` (:mod:`harness.mutation.scope`):
the conformance suites run once against the installed vLLM under coverage.py, one context per
check (a model build's lines credited to every check that used the build, as the mutation reach
does), and every function of vLLM's package whose body ran inside a check is recorded with the
checks that ran it. It names the vLLM version it was measured on; a gate on another version
says so. A file is in scope when one of its functions ran in a check; a file vLLM only imported
(its module-level code runs at import, in every model's process) is not.

The table per function: ``files[path][qualname]`` is a bitmap in hex of the indices in
``checks`` (bit ``i`` set: check ``i`` ran the function), with its first and last line as the
measured file had them.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT

SCOPE_FILE = ROOT / "fixtures" / "gate_scope.json"
#: How to measure it again.
REFRESH = "nemotron-vl-scope --out fixtures/gate_scope.json"
#: The engine leg's scope: what the engine and server checks run of the CPU build, in any of
#: vLLM's processes, charged to the suites (:mod:`harness.mutation.scope_engine`).
ENGINE_SCOPE_FILE = ROOT / "fixtures" / "gate_scope_engine.json"
ENGINE_REFRESH = "nemotron-vl-scope --engine --out fixtures/gate_scope_engine.json"


class ScopeError(ValueError):
    """A scope table that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class FunctionReach:
    """A measured function: its lines in the measured file and the checks that ran it."""

    first_line: int
    last_line: int
    checks: frozenset[int]


@dataclass
class Scope:
    """What the model's checks execute of vLLM (see the module's docstring)."""

    vllm_version: str
    checks: list[str]
    files: dict[str, dict[str, FunctionReach]]  # path from site-packages -> qualname -> reach
    meta: dict[str, Any] = field(default_factory=dict)

    def covers(self, path: str) -> bool:
        return path in self.files

    def checks_of(self, path: str, qualnames: Iterable[str]) -> list[str]:
        """The checks that ran any of ``qualnames`` of ``path``, in the table's order."""
        functions = self.files.get(path, {})
        found: set[int] = set()
        for name in qualnames:
            reach = functions.get(name)
            if reach is not None:
                found |= reach.checks
        return [self.checks[i] for i in sorted(found)]

    def to_json(self) -> dict[str, Any]:
        return {
            "vllm_version": self.vllm_version,
            "meta": self.meta,
            "checks": self.checks,
            "files": {
                path: {
                    name: [r.first_line, r.last_line, _bitmap(r.checks)]
                    for name, r in sorted(functions.items())
                }
                for path, functions in sorted(self.files.items())
            },
        }


def _bitmap(indices: Iterable[int]) -> str:
    value = 0
    for i in indices:
        value |= 1 << i
    return format(value, "x")


def _indices(bitmap: str) -> frozenset[int]:
    value = int(bitmap, 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def read_scope(path: Path = SCOPE_FILE) -> Scope:
    """The scope table at ``path``; :class:`ScopeError` naming the field that is wrong."""
    where = path.name
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ScopeError(f"{where}: expected the JSON table {REFRESH} writes: {e}") from e
    if not isinstance(data, dict):
        raise ScopeError(f"{where}: expected a JSON object, got {type(data).__name__}")
    version, checks, files = data.get("vllm_version"), data.get("checks"), data.get("files")
    if not isinstance(version, str):
        raise ScopeError(f"{where}: vllm_version: expected a string, got {version!r}")
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise ScopeError(f"{where}: checks: expected a list of check ids")
    if not isinstance(files, dict):
        raise ScopeError(f"{where}: files: expected an object of files, got {type(files).__name__}")
    table: dict[str, dict[str, FunctionReach]] = {}
    for file, functions in files.items():
        if not isinstance(functions, dict):
            raise ScopeError(f"{where}: files[{file!r}]: expected an object of functions")
        table[file] = {}
        for name, entry in functions.items():
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and isinstance(entry[0], int)
                and isinstance(entry[1], int)
                and isinstance(entry[2], str)
            ):
                raise ScopeError(
                    f"{where}: files[{file!r}][{name!r}]: expected [first line, last line, "
                    f"bitmap of checks], got {entry!r}"
                )
            try:
                indices = _indices(entry[2])
            except ValueError as e:
                raise ScopeError(
                    f"{where}: files[{file!r}][{name!r}]: the bitmap {entry[2]!r} is not hex"
                ) from e
            if indices and max(indices) >= len(checks):
                raise ScopeError(
                    f"{where}: files[{file!r}][{name!r}]: check {max(indices)} of {len(checks)}"
                )
            table[file][name] = FunctionReach(entry[0], entry[1], indices)
    meta = data.get("meta", {})
    return Scope(version, checks, table, meta if isinstance(meta, dict) else {})


def functions_of(source: str) -> Iterator[tuple[str, int, int]]:
    """Each function and method of a module's ``source`` (nested classes and functions too):
    its qualname, first line (decorators included) and last line."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, int, int]]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                yield prefix + node.name, first, node.end_lineno or node.lineno
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(ast.parse(source).body, "")


def innermost_function(functions: Iterable[tuple[str, int, int]], line: int) -> str | None:
    """The qualname of the innermost of ``functions`` whose lines hold ``line``."""
    best: tuple[int, str] | None = None
    for name, first, last in functions:
        if first <= line <= last and (best is None or last - first < best[0]):
            best = (last - first, name)
    return best[1] if best else None


def changed_functions(source: str, lines: Iterable[int]) -> set[str]:
    """The functions of ``source`` that hold any of the changed ``lines`` (module-level lines
    name none)."""
    functions = list(functions_of(source))
    found = {innermost_function(functions, line) for line in lines}
    return {name for name in found if name is not None}


def summary(scope: Scope) -> Mapping[str, int]:
    """Counts for a report: files, functions, checks."""
    return {
        "files": len(scope.files),
        "functions": sum(len(f) for f in scope.files.values()),
        "checks": len(scope.checks),
    }
