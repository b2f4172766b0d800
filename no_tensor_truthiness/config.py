"""Configuration: ``[tool.no-tensor-truthiness]`` in ``pyproject.toml``, then the command line.

Keys (all optional)::

    [tool.no-tensor-truthiness]
    include = ["*.py"]              # glob patterns a file must match (name or path)
    exclude = ["build/*", "tests/fixtures/*"]   # glob patterns that skip a file or folder
    select = ["TB001", "TB009"]     # only these codes (default: all)
    ignore = ["TB007"]              # never these codes
    tensor-key-pattern = "..."      # regex of dict keys whose values are tensors
"""

from __future__ import annotations

import fnmatch
import functools
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from no_tensor_truthiness.evaluation import DEFAULT_TENSOR_KEY
from no_tensor_truthiness.rules import ALWAYS_REPORTED, RULES

DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".nox",
    ".tox",
    ".venv",
    "venv",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    "node_modules",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
)


class LintConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the file."""


@dataclass(frozen=True)
class LintConfig:
    include: tuple[str, ...] = ("*.py", "*.pyi")
    exclude: tuple[str, ...] = ()
    select: frozenset[str] = frozenset(RULES)
    ignore: frozenset[str] = frozenset()
    tensor_key_pattern: str = DEFAULT_TENSOR_KEY
    source: str = "defaults"
    extra: dict[str, Any] = field(default_factory=dict)

    def enabled(self, code: str) -> bool:
        return (code in self.select and code not in self.ignore) or code in ALWAYS_REPORTED

    def is_excluded(self, path: Path, name_only: bool = False) -> bool:
        """A part of ``path`` (or, with ``name_only``, its last part: the walk has checked
        its parents already) or the whole relative path matches an exclude pattern."""
        parts_re, path_re = _compiled((*DEFAULT_EXCLUDE, *self.exclude))
        parts = (path.name,) if name_only else path.parts
        if any(parts_re.match(part) for part in parts):
            return True
        return path_re is not None and path_re.match(path.as_posix()) is not None

    def is_included(self, path: Path) -> bool:
        parts_re, path_re = _compiled(self.include)
        if parts_re.match(path.name):
            return True
        return path_re is not None and path_re.match(path.as_posix()) is not None

    def digest(self) -> str:
        """What the cache key must change with."""
        return repr((sorted(self.select - self.ignore), self.tensor_key_pattern))


@functools.lru_cache(maxsize=32)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str] | None]:
    """One regex for all patterns against a single name, one for those with a ``/`` against a
    whole relative path."""
    names = re.compile("|".join(fnmatch.translate(p) for p in patterns) or "(?!)")
    with_slash = [p for p in patterns if "/" in p]
    paths = re.compile("|".join(fnmatch.translate(p) for p in with_slash)) if with_slash else None
    return names, paths


def _codes(value: object, key: str, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LintConfigError(f"{where}: {key}: expected a list of rule codes, got {value!r}")
    unknown = sorted(set(value) - set(RULES))
    if unknown:
        raise LintConfigError(f"{where}: {key}: unknown codes {unknown}; known: {sorted(RULES)}")
    return frozenset(value)


def _patterns(value: object, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LintConfigError(f"{where}: {key}: expected a list of glob patterns, got {value!r}")
    return tuple(value)


def from_table(table: dict[str, Any], where: str, base: LintConfig | None = None) -> LintConfig:
    config = base or LintConfig()
    known = {"include", "exclude", "select", "ignore", "tensor-key-pattern"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise LintConfigError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    updates: dict[str, Any] = {"source": where}
    if "include" in table:
        updates["include"] = _patterns(table["include"], "include", where)
    if "exclude" in table:
        updates["exclude"] = _patterns(table["exclude"], "exclude", where)
    if "select" in table:
        updates["select"] = _codes(table["select"], "select", where)
    if "ignore" in table:
        updates["ignore"] = _codes(table["ignore"], "ignore", where)
    if "tensor-key-pattern" in table:
        pattern = table["tensor-key-pattern"]
        try:
            re.compile(pattern)
        except (re.error, TypeError) as e:
            raise LintConfigError(
                f"{where}: tensor-key-pattern: expected a regular expression, got {pattern!r} ({e})"
            ) from e
        updates["tensor_key_pattern"] = pattern
    return replace(config, **updates)


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has our table."""
    here = start.resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(pyproject: Path | None) -> LintConfig:
    if pyproject is None:
        return LintConfig()
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise LintConfigError(f"{pyproject}: cannot read: {e}") from e
    table = data.get("tool", {}).get("no-tensor-truthiness")
    if table is None:
        return LintConfig()
    if not isinstance(table, dict):
        raise LintConfigError(f"{pyproject}: [tool.no-tensor-truthiness] must be a table")
    return from_table(table, str(pyproject))
