"""The rules as a flake8 plugin: ``flake8 --select TB`` runs them in a flake8 setup.

Registered under the ``flake8.extension`` entry point ``TB`` (``pyproject.toml``). flake8 parses
the file and handles ``# noqa`` itself; the plugin reports the truth-context rules (TB001 to
TB009). flake8 reports unparseable files as its own E999, so TB000 never shows here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version

from no_tensor_truthiness.checker import ModuleChecker
from no_tensor_truthiness.rules import INTERNAL_ERROR

try:
    _VERSION = version("nemotron-vl-conformance")
except PackageNotFoundError:  # running from a source tree
    _VERSION = "0"


class Flake8Plugin:
    """flake8's AST plugin protocol: built with the tree, the file name and its lines."""

    name = "no-tensor-truthiness"
    version = _VERSION

    def __init__(self, tree: ast.AST, filename: str, lines: Sequence[str]) -> None:
        self.tree = tree
        self.filename = filename
        self.source = "".join(lines)

    def run(self) -> Iterator[tuple[int, int, str, type[Flake8Plugin]]]:
        if not isinstance(self.tree, ast.Module):
            return
        try:
            findings = ModuleChecker(self.tree, self.source, self.filename).run()
        except Exception as e:  # a bug in the checker: one finding, never a crash of flake8
            yield 1, 0, f"{INTERNAL_ERROR} internal error: {type(e).__name__}: {e}", type(self)
            return
        for finding in findings:
            # flake8 columns are 0-based; the message starts with the code.
            yield finding.line, finding.col - 1, f"{finding.code} {finding.message}", type(self)
