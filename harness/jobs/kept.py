"""A target's outcomes kept, and reused while nothing they were computed from has changed.

Like ``go test``'s cache: a clean run of a target (every check passed or failed as a known
deviation, no incident, no restart) is kept on disk with the inputs its outcomes came from, and
the next main job with the same options reuses it instead of running the target again, as long
as every input is unchanged. A model owner who edits vLLM's model file reruns the vLLM target;
the reference, whose inputs did not change, is not run again.

A kept run's inputs are:

- every file its pytest processes imported, recorded by the results plugin at the end of each
  session (:func:`record_imports`): the suites, the harness, the reference, the target's own
  files (``vllm-file:`` or the installed vLLM) and every library module;
- the harness's data files: ``fixtures/`` (deviations, calibrated bounds, the checkpoint's
  configuration module, schemas) and ``pyproject.toml`` (pytest's settings);
- the options (:func:`options_key`): the target selector, the device, the extra pytest
  arguments, the supervisor's limits, the Python version, the machine and its CPU (its flags
  decide torch's kernels), and the environment variables that steer vLLM, torch, transformers,
  hypothesis or the harness.

An input is unchanged when its size and modification time are those recorded; a file whose time
moved (a ``git checkout``, files written again) but whose content has the digest recorded is
unchanged too. Files of the Python installation (its standard library and ``site-packages``) are
checked by size and time only: the digests of torch's thousands of files would cost more than
they save; an editable install (a vLLM checkout) lives outside it and is digested.

Failing, crashed, interrupted and incomplete runs are never kept: they run again. ``--rerun``
runs every target whatever is kept, and keeps their clean runs. ``NEMOTRON_VL_KEPT_OUTCOMES``
names the folder (default ``.cache/outcomes`` in the repository) or, set to ``off``, turns
reuse off; the harness's own tests run with it off (the root ``conftest.py``), so that no test
reads another's outcomes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from harness import ROOT
from harness.jobs.preload import imported_files
from harness.jobs.results import TargetResults
from harness.jobs.supervisor import Limits

#: The environment variable naming the folder of kept outcomes, or ``off``.
KEPT_OUTCOMES_ENV = "NEMOTRON_VL_KEPT_OUTCOMES"
DEFAULT_KEPT_OUTCOMES = ROOT / ".cache" / "outcomes"
#: Bumped when an entry's layout changes: older entries are then ignored.
ENTRY_VERSION = 1
#: Environment variables whose values can change a check's outcome, by prefix.
OUTCOME_ENV_PREFIXES = (
    "VLLM_",
    "NEMOTRON_VL_",
    "HYPOTHESIS",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "PYTHON",
)
#: ... except these: where caches live, and the supervisor's own bookkeeping.
OUTCOME_ENV_IGNORED = frozenset(
    {
        KEPT_OUTCOMES_ENV,
        "NEMOTRON_VL_ORACLE_CACHE",
        "NEMOTRON_VL_CHECKPOINTS",
        "NEMOTRON_VL_FORK_SERVERS",
        "NEMOTRON_VL_WARM_SERVERS",
        "NEMOTRON_VL_STARTED_AT",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
    }
)
#: The harness's data files the checks read (every ``.py`` file they use is an imported module).
DATA_INPUTS = ("fixtures", "pyproject.toml")


def imports_path(results_path: Path) -> Path:
    """Where a target process records the files it imported, beside its results."""
    return results_path.with_name(results_path.stem + ".imports")


def record_imports(results_path: Path) -> None:
    """Write the source file of every module this process imported (the results plugin calls
    this when its session ends)."""
    path = imports_path(results_path)
    path.write_text("".join(f"{name}\n" for name in imported_files()))


def _installation_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    return tuple(sorted(os.path.join(os.path.abspath(r), "") for r in roots))


def _digest(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@dataclass(frozen=True)
class Input:
    """A file a kept run's outcomes came from, as it was then."""

    path: str
    size: int
    mtime_ns: int
    sha256: str | None  # None: a file of the Python installation, checked by size and time

    @classmethod
    def of(cls, path: str, installation: tuple[str, ...]) -> Input:
        stat = os.stat(path)
        digest = None if path.startswith(installation) else _digest(path)
        return cls(path, stat.st_size, stat.st_mtime_ns, digest)

    def change(self) -> str | None:
        """Why this input is no longer what it was, or None."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return f"{self.path} is gone"
        if (stat.st_size, stat.st_mtime_ns) == (self.size, self.mtime_ns):
            return None
        if self.sha256 is not None and stat.st_size == self.size:
            try:
                if _digest(self.path) == self.sha256:
                    return None
            except OSError:
                return f"{self.path} cannot be read"
        return f"{self.path} changed"


def data_inputs() -> list[str]:
    """The harness's data files (:data:`DATA_INPUTS`)."""
    files: list[str] = []
    for name in DATA_INPUTS:
        path = ROOT / name
        if path.is_file():
            files.append(str(path))
        elif path.is_dir():
            files += sorted(
                str(p) for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            )
    return files


def _cpu() -> str:
    """The CPU's model and flags (torch picks its kernels by them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    wanted: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "flags", "Features", "CPU implementer", "CPU part"):
            wanted.setdefault(key, value.strip())
    return json.dumps(wanted, sort_keys=True)


def options_key(
    selector: str,
    device: str,
    extra: Iterable[str],
    limits: Limits,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything besides files that a target run's outcomes depend on."""
    environ = os.environ if environ is None else environ
    return {
        "selector": selector,
        "device": device,
        "pytest_args": list(extra),
        "limits": asdict(limits),
        "python": sys.version,
        "machine": platform.machine(),
        "cpu": _cpu(),
        "environment": steering_environment(environ),
    }


def steering_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that can change a check's outcome
    (:data:`OUTCOME_ENV_PREFIXES`, less :data:`OUTCOME_ENV_IGNORED`), by name."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(OUTCOME_ENV_PREFIXES) and name not in OUTCOME_ENV_IGNORED
    }


def key_digest(value: Mapping[str, Any], chars: int = 24) -> str:
    """A short digest of ``value``'s JSON (keys sorted): a file name for what it keys."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:chars]


@dataclass(frozen=True)
class Kept:
    """A kept run, found current: its results and JUnit XML, and when it ran."""

    results: TargetResults
    junit: str
    kept_at: str
    wall_s: float | None


class KeptOutcomes:
    """The folder of kept runs: one entry per target and options, the newest."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    @classmethod
    def from_environment(cls) -> KeptOutcomes:
        """The folder :data:`KEPT_OUTCOMES_ENV` names (``off``: none)."""
        value = os.environ.get(KEPT_OUTCOMES_ENV, "").strip()
        if value.lower() == "off":
            return cls(None)
        return cls(Path(value) if value else DEFAULT_KEPT_OUTCOMES)

    def _entry(self, options: Mapping[str, Any]) -> Path:
        assert self.folder is not None
        return self.folder / f"{key_digest(options)}.json"

    def lookup(self, options: Mapping[str, Any]) -> tuple[Kept | None, str]:
        """The kept run for these options if every input is unchanged, and otherwise None with
        why it is not reused."""
        if self.folder is None:
            return None, "reuse is off"
        path = self._entry(options)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None, "no run of these options is kept"
        except (OSError, ValueError) as e:
            return None, f"the kept run {path} cannot be read: {e}"
        if not isinstance(entry, dict) or entry.get("version") != ENTRY_VERSION:
            return None, f"the kept run {path} has another layout"
        if entry.get("options") != json.loads(json.dumps(options)):
            return None, "the kept run's options differ"
        try:
            inputs = [Input(*row) for row in entry["inputs"]]
        except (KeyError, TypeError) as e:
            return None, f"the kept run {path} has malformed inputs: {e}"
        for item in inputs:
            change = item.change()
            if change is not None:
                return None, change
        kept = Kept(
            cast(TargetResults, entry["results"]),
            str(entry.get("junit", "")),
            str(entry.get("kept_at", "")),
            entry.get("wall_s"),
        )
        return kept, ""

    def keep(
        self,
        options: Mapping[str, Any],
        results: TargetResults,
        junit: str,
        imported: Iterable[str],
        wall_s: float | None,
    ) -> Path | None:
        """Keep a clean run with its inputs (the files imported, and :func:`data_inputs`);
        written whole or not at all. None when reuse is off."""
        if self.folder is None:
            return None
        installation = _installation_roots()
        files = sorted(set(imported) | set(data_inputs()))
        inputs = [Input.of(f, installation) for f in files if os.path.isfile(f)]
        entry = {
            "version": ENTRY_VERSION,
            "kept_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": wall_s,
            "options": options,
            "inputs": [[i.path, i.size, i.mtime_ns, i.sha256] for i in inputs],
            "results": results,
            "junit": junit,
        }
        path = self._entry(options)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as file:
            json.dump(entry, file)
        os.chmod(file.name, 0o644)  # a temporary file is private; an entry is not
        os.replace(file.name, path)
        return path


def read_imports(paths: Iterable[Path]) -> list[str] | None:
    """The files every process of a run imported, or None when one did not record them."""
    files: set[str] = set()
    for path in paths:
        try:
            files.update(line for line in path.read_text().splitlines() if line)
        except OSError:
            return None
    return sorted(files)
