"""What a target process imports, imported once by a process that forks many.

Importing vLLM takes about 10 s on a 2-core machine, longer than most checks. A process that
starts many suite runs as forks of itself (the fork server of the main job's target processes,
:mod:`harness.jobs.forkserver`; the mutation runner, :mod:`harness.mutation.runner`) imports
torch, pytest and, for vLLM's targets, vLLM with everything its model's build imports once,
with :func:`preload`, then forks.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness.model_files import MODEL_FAMILY_MODULES


def preload_target_imports(*, vllm: bool, modules: Sequence[str] = ()) -> None:
    """Import what every forked child would otherwise import again: torch, pytest, ``modules``
    and, with ``vllm``, vLLM with everything its model module needs (on CPU), but not the
    model's own modules. pytest rewrites the asserts of the plugins it loads (hypothesis's, the
    harness's) only when it imports them itself: a child whose plugins were imported here runs
    them unrewritten."""
    for name in ("pytest", "torch", *modules):
        importlib.import_module(name)

    if vllm:
        from harness.model_files import MODEL_MODULE
        from harness.targets.vllm.runtime import import_vllm_module

        import_vllm_module(MODEL_MODULE)
        for name in modules_a_build_imports():
            with contextlib.suppress(Exception):  # a child imports it again, and fails there
                importlib.import_module(name)
        # The model's own modules are imported again in each child, after its mutant files
        # replace some of them, so that every import between them binds the replacements, as
        # in a fresh process (measured: nothing else in vLLM holds a name from them).
        for name in MODEL_FAMILY_MODULES:
            sys.modules.pop(name, None)
        # vLLM's registry caches the class it resolved for an architecture: a model built in
        # this process before (another test) would leave it resolving the class of the module
        # just dropped, not the one each child imports.
        from vllm.model_executor.models import registry

        registry._try_load_model_cls.cache_clear()
        registry._try_inspect_model_cls.cache_clear()


#: The longest the build that finds them may take (measured: 3 s on a 2-core machine).
WARM_BUILD_LIMIT_S = 300


def modules_a_build_imports() -> list[str]:
    """The modules, beyond the model's own, that building and loading a model imports as it
    goes (vLLM's kernels, quantization, compilation, cutlass: about 650, measured 1.5 s of each
    child's 4.5 s on one quick check), in their import order; found by a build of the default
    variant in a forked child, so that the parent imports them once and no build runs in it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        scratch = Path(tempfile.mkdtemp(prefix="nemotron-vl-warm-build-"))
        try:
            os.close(read)
            import torch

            # One thread, as in every forked child: a child that uses the OpenMP pool its
            # parent started before the fork waits for its threads forever.
            torch.set_num_threads(1)
            before = set(sys.modules)
            from harness.checkpoints.cache import checkpoint_folder, write_new_folders_under
            from harness.checkpoints.spec import ModelSpec
            from harness.model_files import MODEL_MODULE
            from harness.targets.vllm.build import build_and_load
            from harness.targets.vllm.runtime import import_vllm_module

            write_new_folders_under(scratch)  # os._exit skips the exit handlers
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                build_and_load(import_vllm_module(MODEL_MODULE), checkpoint_folder(ModelSpec()))
            own = tuple(MODEL_FAMILY_MODULES)
            names = [n for n in sys.modules if n not in before and not n.startswith(own)]
            with os.fdopen(write, "w") as out:
                out.write("\n".join(names))
            status = 0
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            os._exit(status)
    os.close(write)
    chunks: list[bytes] = []
    deadline = time.monotonic() + WARM_BUILD_LIMIT_S
    with os.fdopen(read, "rb") as found:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([found], [], [], 1.0)
            if ready:
                chunk = found.read1(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        else:  # a build that hangs here hangs in the children, under their time limits
            os.kill(pid, signal.SIGKILL)
    _, wait_status = os.waitpid(pid, 0)
    # A build that fails here fails in every child too, with its cause: nothing to import.
    if os.waitstatus_to_exitcode(wait_status) != 0:
        return []
    return b"".join(chunks).decode().split()


def fork_frozen() -> int:
    """``os.fork()``, with what this process holds out of the child's collector's sight.

    A forked child's full collections (pytest runs one at its end, vLLM others as it builds)
    would traverse every object inherited from its parent (vLLM's import: about a million),
    writing to each one's header and so copying every page they lie on. Frozen (:func:`gc.freeze`,
    as the gc module's documentation advises before a fork), they stay shared and are never
    traversed: measured 0.6 s a child. The parent's own collector sees them again at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    return pid


def output_to(fd: int) -> None:
    """In a forked child: standard output and error to ``fd`` (closed here), standard input
    from ``/dev/null``, and ``sys``'s streams on them, line-buffered. The child leaves by
    ``os._exit`` after flushing them, so the files are never closed."""
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stdin = open(0, closefd=False)  # noqa: SIM115


def imported_files() -> list[str]:
    """The source file of every module this process imported (absolute paths, sorted)."""
    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str) and os.path.isfile(name):
            files.add(os.path.abspath(name))
    return sorted(files)


def process_running(pid: int) -> bool:
    """Whether process ``pid`` runs (one that ended and awaits its parent's wait does not;
    Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False
