"""One run's checkpoint folders, shared by every process the run starts.

A test run or a main job starts many processes (targets, restarts, the gate's two sides, forked
mutant runs), and each would write the same checkpoint folders again (2 s or more each). Inside
:func:`shared_folders`, :func:`harness.checkpoint.checkpoint_folder` writes each folder once
into the folder named by :data:`SHARED_FOLDERS_ENV`, which started processes inherit. This
module imports no torch: the supervisor opens the block without loading a model's libraries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: The folder of checkpoint folders the processes of one run share.
SHARED_FOLDERS_ENV = "NEMOTRON_VL_CHECKPOINTS"


@contextlib.contextmanager
def shared_folders() -> Iterator[Path]:
    """Share checkpoint folders with every process started inside the block (they inherit
    :data:`SHARED_FOLDERS_ENV`); the folder is removed at its end. Inside a block already
    open (this process's or a parent's), the outer folder is used and left in place."""
    inherited = os.environ.get(SHARED_FOLDERS_ENV)
    if inherited:
        yield Path(inherited)
        return
    root = Path(tempfile.mkdtemp(prefix="nemotron-vl-checkpoints-shared-"))
    os.environ[SHARED_FOLDERS_ENV] = str(root)
    try:
        yield root
    finally:
        if os.environ.get(SHARED_FOLDERS_ENV) == str(root):
            del os.environ[SHARED_FOLDERS_ENV]
        shutil.rmtree(root, ignore_errors=True)
