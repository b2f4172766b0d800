"""Files under test in the engine's own processes.

vLLM's engine core and its worker are processes of their own, spawned afresh (the CPU platform
asks for ``spawn``): a module replaced in this process's ``sys.modules`` (as ``vllm-file:``
replaces them, :mod:`harness.targets.vllm.files`) is the installed one again there. So the
files a pull request changes reach them through the interpreter's start-up: a folder put first
on ``PYTHONPATH`` holds a ``sitecustomize`` module that, in every process started with
:data:`MODULE_FILES_ENV` set, installs an import finder serving each named module from its file
before vLLM is imported. Every later import of the module, and of anything that imports it, then
gets the file under test, in whichever process.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: JSON ``{module name: file}``: the modules the engine's processes load from the files.
MODULE_FILES_ENV = "NEMOTRON_VL_MODULE_FILES"

SITECUSTOMIZE = f'''"""Written by harness.targets.engine.overlay: modules served from files."""
import importlib.abc
import importlib.util
import json
import os
import sys

_FILES = json.loads(os.environ.get({MODULE_FILES_ENV!r}, "{{}}"))


class _FilesUnderTest(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        file = _FILES.get(name)
        return None if file is None else importlib.util.spec_from_file_location(name, file)


if _FILES:
    sys.meta_path.insert(0, _FilesUnderTest())
'''


def overlay_environment(files: Mapping[str, Path]) -> dict[str, str]:
    """The variables that make processes started with them import each module of ``files``
    (module name to file) from its file: a new start-up folder first on ``PYTHONPATH``."""
    folder = Path(tempfile.mkdtemp(prefix="nemotron-vl-overlay-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": str(folder) + (os.pathsep + path if path else ""),
        MODULE_FILES_ENV: json.dumps({name: str(file.resolve()) for name, file in files.items()}),
    }
