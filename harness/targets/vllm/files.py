"""Model files from any vLLM revision or pull request, loaded in place of the installed modules.

A file replaces the installed module with the same path under ``vllm/`` (a bare file name names
one of the model's own modules); its own imports resolve against the installed vLLM. When only
some of the model's modules are replaced, the installed VL module is re-executed so that its
``from .radio import RadioModel``-style bindings see the replacements.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from harness.model_files import BARE_FILE_NAMES, MODEL_MODULE
from harness.targets.base import TargetLoadError, TargetUnavailable
from harness.targets.vllm.runtime import import_vllm_module, vllm_version


def module_name_for(path: Path) -> str:
    """The vLLM module a file replaces: its path from the last ``vllm/`` component, or for a bare
    file name one of the model's own modules."""
    parts = path.resolve().parts
    if "vllm" in parts[:-1]:
        start = len(parts) - 1 - parts[::-1].index("vllm")
        return ".".join((*parts[start:-1], path.stem))
    if path.name in BARE_FILE_NAMES:
        return BARE_FILE_NAMES[path.name]
    raise TargetLoadError(
        f"vllm-file: cannot tell which vLLM module {path} replaces: give it a path under a "
        f"'vllm/' folder (e.g. .../vllm/model_executor/models/{path.name}) or one of the "
        f"names {sorted(BARE_FILE_NAMES)}"
    )


def _load_order(name: str) -> int:
    # Leaves first: processors and configs, then the towers and the LM, the VL model last.
    if name == MODEL_MODULE:
        return 2
    if name.startswith("vllm.model_executor."):
        return 1
    return 0


def load_model_files(paths: Sequence[Path]) -> types.ModuleType:
    """Load ``paths`` in place of the installed modules; return the VL model module.

    When only some of the model's modules are replaced, the installed VL model module is
    re-executed too, so that its ``from .radio import RadioModel``-style bindings see the
    replacements.
    """
    import_vllm_module("vllm")
    replaced_modules: dict[str, Path] = {}  # module name -> the file that replaces it
    for path in paths:
        if not path.is_file():
            raise TargetLoadError(f"vllm-file: {path}: no such file")
        name = module_name_for(path)
        if name in replaced_modules:
            raise TargetLoadError(
                f"vllm-file: {path} and {replaced_modules[name]} both replace {name}"
            )
        replaced_modules[name] = path
    if MODEL_MODULE not in replaced_modules:
        installed = importlib.util.find_spec(MODEL_MODULE)
        if installed is None or installed.origin is None:
            raise TargetUnavailable(f"{MODEL_MODULE} is not in the installed vLLM")
        replaced_modules[MODEL_MODULE] = Path(installed.origin)

    saved = {name: sys.modules.get(name) for name in replaced_modules}
    # What each replacement displaces, taken just before it runs: an earlier replacement may
    # have imported the installed module first.
    displaced: dict[str, types.ModuleType | None] = {}
    try:
        for name in sorted(replaced_modules, key=_load_order):
            displaced[name] = sys.modules.get(name)
            _exec_in_place(name, replaced_modules[name])
    except BaseException:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        raise
    for name, original in displaced.items():
        if original is not None and name != MODEL_MODULE:
            _rebind_importers(name, original, sys.modules[name])
    return sys.modules[MODEL_MODULE]


def _rebind_importers(
    name: str, installed: types.ModuleType, replacement: types.ModuleType
) -> None:
    """vLLM modules imported before the replacement that took names from the installed module
    (``from vllm.lora.peft_helper import PEFTHelper``) hold its functions and classes (and
    instances of its classes): point each such module-level name at the replacement's object
    of the same name. References held elsewhere (class attributes, registries, closures) are
    not reached; the model's own module is re-executed whole instead."""
    defined = {
        id(value): attr
        for attr, value in vars(installed).items()
        if getattr(value, "__module__", None) == name
    }
    for module in list(sys.modules.values()):
        module_name = getattr(module, "__name__", "")
        if module is replacement or not module_name.startswith("vllm"):
            continue
        for attr, value in list(vars(module).items()):
            source = defined.get(id(value))
            if source is not None and hasattr(replacement, source):
                setattr(module, attr, getattr(replacement, source))


def _exec_in_place(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetLoadError(f"vllm-file: {path}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        # "cannot import name 'X' from 'M'": the name is what is missing, not the module.
        named = re.match(r"cannot import name '([^']+)'", str(e))
        missing = f"{named.group(1)} (from {e.name})" if named else (e.name or str(e))
        raise TargetLoadError(
            f"vllm-file: {path}: the installed vLLM {vllm_version()} lacks {missing!r} "
            f"({e}); this file needs a newer or different vLLM"
        ) from e
    except SyntaxError as e:
        raise TargetLoadError(f"vllm-file: {path}:{e.lineno}: syntax error: {e.msg}") from e
    except Exception as e:
        raise TargetLoadError(
            f"vllm-file: {path}: failed while importing as {name}: {type(e).__name__}: {e}"
        ) from e
    parent = sys.modules.get(parent_name)
    if parent is not None:
        setattr(parent, child, module)
