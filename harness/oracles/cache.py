"""The oracle's answers kept on disk: the reference's results for a request, reused by later runs.

The parity checks of a target compare it with the reference on the same request: the reference
answers in fp32 on the CPU, a deterministic function of its code, the checkpoint folder it loads
(written by ``harness/checkpoints`` from the variant), the serving options, the request and the
versions of the libraries it computes with. :class:`OracleCache` keys each answer by all of them
(:func:`oracle_fingerprint` for the code and libraries, :func:`request_digest` for the request), so
a warm run, or the other side of the gate, reads what an earlier run computed instead of running
the reference's towers again; any change to one of them is another key.

An answer is kept whatever torch's thread count was when it was computed: the reference computes
in fp32, where another count's rounding is far below every bound a target is judged by
(measured, 1 against 2 threads: at most 4.5e-7 relative on an item, audio; the tightest bound is
1e-4, vLLM serving fp32; bf16's start at 1 %), and no check compares an oracle's tower rows bit
for bit (only rows copied or looked up, which no count changes).

Only the oracle's answers are kept: the implementation under test, the reference target included,
always runs; and none are kept while a reference mutant patches the reference in the process.
``NEMOTRON_VL_ORACLE_CACHE`` names the cache folder (default ``.cache/oracle`` in the repository)
or, set to ``off``, turns the cache off. Answers of other code are dropped when one of this code's
is kept. A request the digest cannot describe (a type it does not know) and a request the
reference refuses are not kept: they run every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from PIL import Image

from harness import ROOT
from harness.inputs.requests import audio_decode_cap_s
from harness.targets.reference.target import ReferenceTarget

#: The environment variable naming the cache folder, or ``off``.
ORACLE_CACHE_ENV = "NEMOTRON_VL_ORACLE_CACHE"
DEFAULT_ORACLE_CACHE = ROOT / ".cache" / "oracle"
#: The code the reference's answers come from: the model, its target adapter (request path), and
#: the checkpoint writer (the weights it loads).
ORACLE_SOURCES = (
    "reference_impl",
    "harness/targets/reference",
    "harness/checkpoints",
    "fixtures/checkpoint",
)
#: The libraries it computes with (transformers: Parakeet's encoder, the tokenizer).
ORACLE_LIBRARIES = ("torch", "numpy", "transformers", "tokenizers", "pillow", "av")

#: The fingerprint's characters that name its folder.
FINGERPRINT_CHARS = 16

_T = TypeVar("_T")


def _is_fingerprint(name: str) -> bool:
    return len(name) == FINGERPRINT_CHARS and all(c in "0123456789abcdef" for c in name)


class Undescribed(TypeError):
    """A request holds a value :func:`request_digest` cannot describe."""


@cache
def oracle_fingerprint() -> str:
    """A digest of the reference's sources (:data:`ORACLE_SOURCES`) and the versions of the
    libraries it computes with (:data:`ORACLE_LIBRARIES`)."""
    digest = hashlib.sha256()
    for top in ORACLE_SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    for name in ORACLE_LIBRARIES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{name}=={version}\0".encode())
    return digest.hexdigest()


def request_digest(value: object) -> str:
    """A digest of everything a request (or any value in it: a variant, a serving
    configuration) holds: text, numbers, pixels, samples, bytes, embeddings (their dtype, shape
    and bytes), dataclasses field by field (labels apart).
    Raises :class:`Undescribed` for a value of another type."""
    digest = hashlib.sha256()
    for part in _parts(value):
        digest.update(part)
    return digest.hexdigest()


def _parts(value: object) -> Iterable[bytes]:
    kind = type(value).__name__
    yield kind.encode() + b"\0"
    if value is None or isinstance(value, (bool, int, float, str)):
        yield repr(value).encode() + b"\0"
    elif isinstance(value, bytes):
        yield str(len(value)).encode() + b"\0" + value
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        yield f"{tensor.dtype}{tuple(tensor.shape)}\0".encode()
        yield tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    elif isinstance(value, np.ndarray):
        yield f"{value.dtype}{value.shape}\0".encode()
        yield np.ascontiguousarray(value).tobytes()
    elif isinstance(value, Image.Image):
        yield f"{value.mode}{value.size}\0".encode()
        yield value.tobytes()
    elif isinstance(value, (list, tuple)):
        yield str(len(value)).encode() + b"\0"
        for item in value:
            yield from _parts(item)
    elif isinstance(value, dict):
        yield str(len(value)).encode() + b"\0"
        for key, item in value.items():
            yield from _parts(key)
            yield from _parts(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if not f.compare:  # a label, not part of what the value is
                continue
            yield f.name.encode() + b"\0"
            yield from _parts(getattr(value, f.name))
    else:
        raise Undescribed(f"request_digest: no description of a {kind}")


#: What the oracle caches of this process answered: answers read (``hits``), computed and kept
#: (``misses``), computed and not kept (``uncached``: a request the digest cannot describe).
ANSWERED: dict[str, int] = {"hits": 0, "misses": 0, "uncached": 0}


def answered() -> dict[str, int]:
    """:data:`ANSWERED`, a copy (the results file's ``oracle_answers``)."""
    return dict(ANSWERED)


class OracleCache:
    """Answers of the reference kept under ``folder``, each lookup counted in :data:`ANSWERED`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._pruned = False

    @staticmethod
    def from_environment() -> OracleCache | None:
        """The cache :data:`ORACLE_CACHE_ENV` names (None: ``off``)."""
        setting = os.environ.get(ORACLE_CACHE_ENV, "")
        if setting.lower() == "off":
            return None
        return OracleCache(Path(setting) if setting else DEFAULT_ORACLE_CACHE)

    def answer(self, question: str, inputs: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``'s value, kept under the digest of ``question``, ``inputs``, the
        oracle's fingerprint and the audio decode cap in force: read when an earlier run kept
        it, else computed and kept. An exception from ``compute`` propagates, nothing kept."""
        try:
            key = request_digest((question, oracle_fingerprint(), audio_decode_cap_s(), *inputs))
        except Undescribed:
            ANSWERED["uncached"] += 1
            return compute()
        path = self._current() / key[:2] / f"{key}.pt"
        if path.is_file():
            try:
                value: _T = torch.load(path, weights_only=False)
            except Exception:  # a torn or foreign file: computed again, and replaced
                pass
            else:
                ANSWERED["hits"] += 1
                return value
        ANSWERED["misses"] += 1
        value = compute()
        self._keep(path, value)
        return value

    def _current(self) -> Path:
        """This code's folder: one per fingerprint, so that answers of older code go at once."""
        return self.folder / oracle_fingerprint()[:FINGERPRINT_CHARS]

    def _keep(self, path: Path, value: object) -> None:
        if not self._pruned:  # answers of other code are never read again: dropped
            self._pruned = True
            for other in self.folder.glob("*"):
                if other != self._current() and other.is_dir() and _is_fingerprint(other.name):
                    shutil.rmtree(other, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        # Written whole, then renamed: a process reading the key sees the old file or the new one.
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".part")
        with os.fdopen(handle, "wb") as file:
            file.write(buffer.getvalue())
        os.replace(temporary, path)


@cache
def oracle_target(target_name: str) -> ReferenceTarget:
    """The reference as this process's oracle for the target ``target_name``: one target (each
    variant built once for every check that asks it), its answers kept in the cache
    :data:`ORACLE_CACHE_ENV` names; not kept for a reference mutant, whose patches to the
    reference's code in this process the cache's key cannot see."""
    patched = target_name.startswith("reference")
    return ReferenceTarget(answers=None if patched else OracleCache.from_environment())
