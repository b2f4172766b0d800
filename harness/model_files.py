"""The model's vLLM files, where the installed ones are, and the mutant writer: one table.

Each file is named by its module (``vllm.model_executor.models.nano_nemotron_vl``) and by its
path relative to site-packages, which is also its path in a vLLM checkout
(``vllm/model_executor/models/nano_nemotron_vl.py``). The installed files are found without
importing vLLM (or torch): :func:`installed_file` asks only where the ``vllm`` package lies.
:func:`write_mutated_copy` writes an edited copy of an installed file in vLLM's layout, as the
regression mutants (``mutation.file_mutants``) and the first-order mutants
(``mutation.ast_mutants``) both do.

Torch-free and standard library only: the gate and both mutation tools import it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path


def file_of(module: str) -> Path:
    """A vLLM module's file, relative to site-packages: ``vllm.a.b`` -> ``vllm/a/b.py``."""
    return Path(*module.split(".")).with_suffix(".py")


def module_of(file: Path) -> str:
    """The module of a vLLM file relative to site-packages: ``vllm/a/b.py`` -> ``vllm.a.b``."""
    return ".".join(file.with_suffix("").parts)


MODEL_MODULE = "vllm.model_executor.models.nano_nemotron_vl"
PROCESSOR_MODULE = "vllm.transformers_utils.processors.nano_nemotron_vl"
RADIO_MODULE = "vllm.model_executor.models.radio"
PARAKEET_MODULE = "vllm.model_executor.models.parakeet"
NEMOTRON_H_MODULE = "vllm.model_executor.models.nemotron_h"
#: The files a pull request to this model usually touches, by module name (the VL model last).
MODEL_FAMILY_MODULES = (
    PROCESSOR_MODULE,
    RADIO_MODULE,
    PARAKEET_MODULE,
    NEMOTRON_H_MODULE,
    MODEL_MODULE,
)
#: The towers' configs: also the model's files, but only read, never re-imported in place.
CONFIG_MODULES = (
    "vllm.transformers_utils.configs.radio",
    "vllm.transformers_utils.configs.parakeet",
)
#: A bare file name (no ``vllm/`` in its path) names one of these modules (the processor module
#: shares the VL model's file name, which names the model).
BARE_FILE_NAMES = {
    file_of(name).name: name
    for name in (MODEL_MODULE, RADIO_MODULE, PARAKEET_MODULE, NEMOTRON_H_MODULE)
}

MODEL_FILE = file_of(MODEL_MODULE)
PROCESSOR_FILE = file_of(PROCESSOR_MODULE)
RADIO_FILE = file_of(RADIO_MODULE)
PARAKEET_FILE = file_of(PARAKEET_MODULE)
NEMOTRON_H_FILE = file_of(NEMOTRON_H_MODULE)
#: EVS (efficient video sampling): the helpers that prune a video's repeated patches.
EVS_FILE = file_of("vllm.multimodal.video_prune.evs")
#: Not the model's, but a regression mutant edits it: vLLM's LoRA adapter config.
PEFT_HELPER_FILE = Path("vllm/lora/peft_helper.py")


class VllmNotInstalled(LookupError):
    """No vLLM is installed: there are no installed files to read."""


def installed_file(relative: Path) -> Path:
    """An installed file of vLLM, by its path relative to site-packages (``vllm/...``).

    Only the ``vllm`` package's location is looked up; vLLM is not imported."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise VllmNotInstalled("vLLM is not installed: mutants are edits of its model files")
    return Path(next(iter(spec.submodule_search_locations))).parent / relative


def installed_model_file() -> Path:
    """The installed VL model file (``vllm/model_executor/models/nano_nemotron_vl.py``)."""
    return installed_file(MODEL_FILE)


def write_mutated_copy(relative: Path, dest_dir: Path, mutate: Callable[[str], str]) -> Path:
    """Write ``mutate`` of the installed file ``relative``'s text at ``dest_dir / relative``, in
    vLLM's layout, so that the copy names the module it replaces (the installed file is never
    edited); its path, for ``--target=vllm-file:PATH``."""
    source = installed_file(relative).read_text()
    out = dest_dir / relative
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(mutate(source))
    return out
