"""Each checkpoint folder written once: per process, or once for every process of every run.

:func:`checkpoint_folder` writes a variant's folder the first time a process asks for it, into
a temporary root removed at exit. A test run or a main job starts many processes (targets,
restarts, the gate's two sides, forked mutant runs), and each would write the same folders again
(0.3 to 0.5 s each, 40 to 90 MB: the vocabulary's embeddings): inside :func:`shared_folders`,
every folder is written once into the folder named by :data:`SHARED_FOLDERS_ENV`, which started
processes inherit. That folder is kept between runs (:data:`DEFAULT_SHARED_FOLDERS`, pruned of
folders older code wrote), so that a main job run again writes none; ``NEMOTRON_VL_CHECKPOINTS=off``
gives each run a temporary one instead. A folder's name carries a digest of the code and the
libraries its bytes come from (:func:`writer_digest`). The supervisor opens the block without
loading a model's libraries, so this module imports torch and the writer only when a folder is
written.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from harness import ROOT

if TYPE_CHECKING:
    import torch

    from harness.checkpoints.spec import ModelSpec

#: The folder of checkpoint folders the processes of one run share, or ``off``.
SHARED_FOLDERS_ENV = "NEMOTRON_VL_CHECKPOINTS"
#: Where they are kept between runs when :data:`SHARED_FOLDERS_ENV` is not set.
DEFAULT_SHARED_FOLDERS = ROOT / ".cache" / "checkpoints"
SHARED_FOLDERS_OFF = "off"
#: A folder of other code (or a writer's private copy, its writer dead) is removed once it has
#: not been used for this long (a folder's time is its last use by a process).
STALE_AFTER_S = 3600.0


@contextlib.contextmanager
def shared_folders() -> Iterator[Path]:
    """Share checkpoint folders with every process started inside the block (they inherit
    :data:`SHARED_FOLDERS_ENV`): the folder it names, else the kept one
    (:data:`DEFAULT_SHARED_FOLDERS`), else (``off``) a temporary one removed at the block's
    end. Inside a block already open (this process's or a parent's), its folder is used."""
    inherited = os.environ.get(SHARED_FOLDERS_ENV)
    if inherited and inherited != SHARED_FOLDERS_OFF:
        yield Path(inherited)
        return
    temporary = inherited == SHARED_FOLDERS_OFF
    if temporary:
        root = Path(tempfile.mkdtemp(prefix="nemotron-vl-checkpoints-shared-"))
    else:
        root = kept_folders(DEFAULT_SHARED_FOLDERS)
    os.environ[SHARED_FOLDERS_ENV] = str(root)
    try:
        yield root
    finally:
        if os.environ.get(SHARED_FOLDERS_ENV) == str(root):
            if inherited is None:
                del os.environ[SHARED_FOLDERS_ENV]
            else:
                os.environ[SHARED_FOLDERS_ENV] = inherited
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def kept_folders(root: Path, now: float | None = None) -> Path:
    """``root``, created, without the folders other code wrote or writers left half-written,
    unused for :data:`STALE_AFTER_S` or longer: the folders of this code stay for the next run."""
    root.mkdir(parents=True, exist_ok=True)
    now = time.time() if now is None else now
    current = f"-{writer_digest()}"
    for entry in root.iterdir():
        if entry.name.endswith(current) and not entry.name.startswith("."):
            continue
        with contextlib.suppress(OSError):  # another run removed it first
            if now - entry.stat().st_mtime >= STALE_AFTER_S:
                shutil.rmtree(entry)
    return root


_FOLDERS: dict[tuple[ModelSpec, int], Path] = {}
_FOLDERS_LOCK = threading.RLock()
_TEMP_ROOT: list[Path] = []

#: The code a folder's bytes depend on (and the libraries of :data:`_WRITER_LIBRARIES`).
_WRITER_SOURCES = (
    ROOT / "harness" / "checkpoints" / "spec.py",
    ROOT / "harness" / "checkpoints" / "writer.py",
    ROOT / "fixtures" / "checkpoint" / "configuration_nano_nemotron_vl.py",
    *sorted((ROOT / "reference_impl").rglob("*.py")),
)
#: The libraries that draw, serialize and write a folder's tensors and tokenizer.
_WRITER_LIBRARIES = ("torch", "safetensors", "tokenizers", "transformers")


@functools.cache
def writer_digest() -> str:
    """A digest of the code that writes the folders (:data:`_WRITER_SOURCES`) and of the
    versions of the libraries it writes them with: a folder kept between runs is read only by
    the code and libraries that would write the same bytes."""
    digest = hashlib.sha256()
    for library in _WRITER_LIBRARIES:
        digest.update(f"{library}=={importlib.metadata.version(library)}\n".encode())
    for path in _WRITER_SOURCES:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


#: The longest slug a folder is named by whole: transformers names the configuration module it
#: loads from a folder after the folder, each ``-`` written ``_hyphen_``, and a file name over 255
#: bytes cannot be created (a variant of the covering array changes a dozen options).
LONGEST_WHOLE_SLUG = 60


def folder_name(spec: ModelSpec) -> str:
    """The name of ``spec``'s folder: its slug, or a long slug's start and a digest of it."""
    slug = spec.slug
    if len(slug) <= LONGEST_WHOLE_SLUG:
        return slug
    digest = hashlib.sha256(slug.encode()).hexdigest()[:12]
    return f"{slug[:40].rstrip('-')}-{digest}"


def _shared_folder(root: Path, spec: ModelSpec, seed: int) -> Path:
    """``spec``'s folder under the shared ``root``: written once by whichever process needs it
    first, into a private folder renamed into place when complete, so that a reader never sees
    half a folder and two writers at once both leave a whole one."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"{SHARED_FOLDERS_ENV}: expected an existing folder, got {str(root)!r}"
        )
    final = root / f"{folder_name(spec)}-seed{seed}-{writer_digest()}"
    if final.is_dir():
        with contextlib.suppress(OSError):  # its time is its last use (kept_folders)
            os.utime(final)
        return final
    from harness.checkpoints.writer import write_checkpoint

    private = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    write_checkpoint(spec, private, seed=seed)
    try:
        private.rename(final)
    except OSError:  # another process renamed its copy first: the same bytes
        shutil.rmtree(private, ignore_errors=True)
        if not final.is_dir():
            raise
    return final


def write_new_folders_under(root: Path) -> None:
    """Write the folders not written yet under ``root`` from now on (the caller removes it):
    a forked child, which exits without running the parent's exit handlers, keeps the
    parent's folders and writes its own where it will remove them. Folders shared through
    :data:`SHARED_FOLDERS_ENV` are still read from and written to the shared folder."""
    with _FOLDERS_LOCK:
        root.mkdir(parents=True, exist_ok=True)
        _TEMP_ROOT[:] = [root]


def checkpoint_folder(spec: ModelSpec, seed: int = 0) -> Path:
    """The folder of ``spec``, written once per process into a temporary root removed at exit,
    or once into the folder :data:`SHARED_FOLDERS_ENV` names (unless ``off``)."""
    spec = spec.checkpoint
    with _FOLDERS_LOCK:
        key = (spec, seed)
        if key not in _FOLDERS:
            shared = os.environ.get(SHARED_FOLDERS_ENV)
            if shared and shared != SHARED_FOLDERS_OFF:
                _FOLDERS[key] = _shared_folder(Path(shared), spec, seed)
                return _FOLDERS[key]
            if not _TEMP_ROOT:
                root = Path(tempfile.mkdtemp(prefix="nemotron-vl-checkpoints-"))
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                _TEMP_ROOT.append(root)
            folder = _TEMP_ROOT[0] / f"{folder_name(spec)}-seed{seed}"
            from harness.checkpoints.writer import write_checkpoint

            _FOLDERS[key] = write_checkpoint(spec, folder, seed=seed)
        return _FOLDERS[key]


_WEIGHTS: dict[tuple[ModelSpec, int], dict[str, torch.Tensor]] = {}


def checkpoint_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """The tensors of ``spec``'s folder by checkpoint name, read once per process: each call
    gives a new dict (change it freely), the tensors are shared (never change them in place)."""
    spec = spec.checkpoint
    with _FOLDERS_LOCK:
        key = (spec, seed)
        if key not in _WEIGHTS:
            from reference_impl.checkpoint import read_weights

            _WEIGHTS[key] = read_weights(checkpoint_folder(spec, seed))
        return dict(_WEIGHTS[key])


@contextlib.contextmanager
def reading_folder(spec: ModelSpec, folder: Path, seed: int = 0) -> Iterator[None]:
    """Inside the block, :func:`checkpoint_folder` gives ``folder`` for ``spec`` (a folder
    written elsewhere, for instance by the command line), so what reads it does not write
    another."""
    key = (spec.checkpoint, seed)
    with _FOLDERS_LOCK:
        before = _FOLDERS.get(key)
        _FOLDERS[key] = folder
        try:
            yield
        finally:
            if before is None:
                del _FOLDERS[key]
            else:
                _FOLDERS[key] = before
