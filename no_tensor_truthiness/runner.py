"""Finding files, skipping those that cannot hold a finding, caching by content, using every
core.

A file whose text mentions neither torch nor a tensor-typed name nor a multimodal input key
cannot produce a finding, so it is not parsed (its syntax is not checked either). Results are
cached by the content hash of each file (with the lint's version and configuration), so an
unchanged rerun only reads and hashes.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from no_tensor_truthiness.checker import check_source
from no_tensor_truthiness.config import LintConfig
from no_tensor_truthiness.evaluation import DEFAULT_TENSOR_KEY
from no_tensor_truthiness.finding import Finding, Fix
from no_tensor_truthiness.rules import FILE_NOT_CHECKED, INTERNAL_ERROR

VERSION = "3"
#: Text without any of these cannot contain a tensor the checker would recognise.
_MAY_HOLD_TENSORS = re.compile(
    rb"torch|Tensor|Parameter|_embeds|_embeddings|pixel_values|_features|_mask"
)


@dataclass
class RunStats:
    files: int = 0
    parsed: int = 0
    skipped: int = 0  # could not hold a finding: not parsed
    cached: int = 0
    errors: int = 0  # TB000 (unparseable) files
    internal_errors: int = 0  # TB999: bugs in the checker
    lines: int = 0


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)


def discover(paths: Sequence[Path], config: LintConfig) -> list[Path]:
    """Python files under ``paths``. Exclude patterns match path parts *below* each given path
    (a project living under ``.venv/`` or ``build/`` can still be linted by naming it); files
    given directly are kept unless excluded by their own relative path."""
    found: list[Path] = []
    for root in paths:
        if root.is_file():
            if not config.is_excluded(root if not root.is_absolute() else Path(root.name)):
                found.append(root)
            continue
        for folder, dirs, files in os.walk(root):
            base = Path(folder)
            rel_base = base.relative_to(root)
            dirs[:] = sorted(d for d in dirs if not config.is_excluded(rel_base / d, True))
            for name in sorted(files):
                rel = rel_base / name
                if config.is_included(rel) and not config.is_excluded(rel, True):
                    found.append(base / name)
    return found


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def check_bytes(
    data: bytes, path: str, tensor_key: str, prefilter: bool
) -> tuple[list[Finding], bool]:
    """Findings for one file's bytes, and whether it was parsed."""
    if prefilter and _MAY_HOLD_TENSORS.search(data) is None:
        return [], False
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        reason = f"file not checked: not UTF-8 ({e.reason})"
        return [Finding(path, 1, 1, FILE_NOT_CHECKED, reason)], True
    return check_source(source, path, tensor_key), True


def _work(
    batch: list[tuple[str, str]], tensor_key: str, prefilter: bool
) -> list[tuple[str, str, list[Finding], bool, int]]:
    # Syntax trees are many small objects that live until the file is done: the cyclic
    # collector only slows their construction (about 15% of parse time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _work_files(batch, tensor_key, prefilter)
    finally:
        if enabled:
            gc.enable()


def _work_files(
    batch: list[tuple[str, str]], tensor_key: str, prefilter: bool
) -> list[tuple[str, str, list[Finding], bool, int]]:
    out = []
    for path, shown in batch:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            unread = Finding(shown, 1, 1, FILE_NOT_CHECKED, f"cannot read: {e}")
            out.append((path, "", [unread], False, 0))
            continue
        findings, parsed = check_bytes(data, shown, tensor_key, prefilter)
        out.append((path, _digest(data), findings, parsed, data.count(b"\n")))
    return out


class Cache:
    """``{absolute path: [content digest, findings, size, mtime_ns]}`` in one JSON file.

    A file whose size and modification time are those recorded is a hit without being read
    (as ruff and mypy do); otherwise its content digest decides. A file modified less than
    :data:`RACY_S` seconds before it was cached records no stat: a same-size rewrite within the
    clock's resolution must not pass for unchanged (git's "racy clean" rule)."""

    def __init__(self, folder: Path | None, config: LintConfig) -> None:
        self.path = None if folder is None else folder / f"cache-v{VERSION}.json"
        self.key = _digest((VERSION + config.digest()).encode())
        self.entries: dict[str, list[Any]] = {}
        self.dirty = False
        if self.path is not None and self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
                if data.get("key") == self.key:
                    self.entries = data["files"]
            except (OSError, ValueError, KeyError):
                self.entries = {}

    def lookup(self, path: str) -> list[Finding] | None:
        """The cached findings of ``path`` if it is unchanged: by stat, else by content."""
        entry = self.entries.get(path)
        if entry is None:
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        if len(entry) == 4 and entry[2:] == [stat.st_size, stat.st_mtime_ns]:
            return self.findings(entry)
        try:
            with open(path, "rb") as f:
                digest = _digest(f.read())
        except OSError:
            return None
        if digest != entry[0]:
            return None
        self.entries[path] = [digest, entry[1], *_trusted_stat(stat)]
        self.dirty = True
        return self.findings(entry)

    @staticmethod
    def findings(entry: list[Any]) -> list[Finding]:
        return [
            Finding(
                str(f["path"]),
                int(f["line"]),
                int(f["col"]),
                str(f["code"]),
                str(f["message"]),
                int(f["end_line"]),
                int(f["end_col"]),
                None if f.get("fix") is None else Fix(**f["fix"]),
            )
            for f in entry[1]
        ]

    def put(self, path: str, digest: str, findings: list[Finding]) -> None:
        try:
            stat: list[int] = _trusted_stat(os.stat(path))
        except OSError:
            stat = [-1, -1]
        self.entries[path] = [digest, [asdict(f) for f in findings], *stat]
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            (self.path.parent / ".gitignore").write_text("*\n")
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": self.key, "files": self.entries}))
            tmp.replace(self.path)
        except OSError:
            pass  # a cache that cannot be written is only slower


RACY_S = 2.0


def _trusted_stat(stat: os.stat_result) -> list[int]:
    """``[size, mtime_ns]``, or a stat no file has when the file changed too recently."""
    if time.time_ns() - stat.st_mtime_ns < RACY_S * 1e9:
        return [-1, -1]
    return [stat.st_size, stat.st_mtime_ns]


def _batches(items: list[tuple[str, str]], count: int) -> Iterator[list[tuple[str, str]]]:
    size = max(1, min(64, len(items) // (count * 4) or 1))
    for start in range(0, len(items), size):
        yield items[start : start + size]


def run(
    files: Iterable[Path],
    config: LintConfig,
    *,
    cache_dir: Path | None = None,
    jobs: int | None = None,
    display_root: Path | None = None,
    prefilter: bool = True,
) -> RunResult:
    """Check ``files``; cached files are read and hashed only. ``prefilter=False`` parses and
    checks every file, even those that cannot hold a finding (the robustness survey)."""
    result = RunResult()
    cache = Cache(cache_dir, config)
    prefilter = prefilter and config.tensor_key_pattern == DEFAULT_TENSOR_KEY
    todo: list[tuple[str, str]] = []
    for file in files:
        result.stats.files += 1
        shown = _display(file, display_root)
        hit = cache.lookup(os.path.abspath(file))
        if hit is not None:
            result.stats.cached += 1
            result.findings += hit
            continue
        todo.append((str(file), shown))
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and len(todo) > 8:
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [
                pool.submit(_work, batch, config.tensor_key_pattern, prefilter)
                for batch in _batches(todo, jobs)
            ]
            outputs = [item for future in futures for item in future.result()]
    else:
        outputs = _work(todo, config.tensor_key_pattern, prefilter)
    for path, digest, findings, parsed, lines in outputs:
        result.stats.parsed += parsed
        result.stats.skipped += not parsed
        result.stats.lines += lines
        if digest:
            cache.put(os.path.abspath(path), digest, findings)
        result.findings += findings
    cache.save()
    result.findings = sorted(f for f in result.findings if config.enabled(f.code))
    result.stats.errors = sum(1 for f in result.findings if f.code == FILE_NOT_CHECKED)
    result.stats.internal_errors = sum(1 for f in result.findings if f.code == INTERNAL_ERROR)
    return result


def _display(path: Path, root: Path | None) -> str:
    if root is None:
        return str(path)
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)
