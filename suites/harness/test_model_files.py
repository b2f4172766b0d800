"""The table of the model's vLLM files (``harness/model_files.py``): torch-free, and every file
it names is in the installed vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.model_files import (
    BARE_FILE_NAMES,
    CONFIG_MODULES,
    MODEL_FAMILY_MODULES,
    MODEL_FILE,
    MODEL_MODULE,
    NEMOTRON_H_FILE,
    PARAKEET_FILE,
    PEFT_HELPER_FILE,
    PROCESSOR_FILE,
    RADIO_FILE,
    file_of,
    installed_file,
    installed_model_file,
    module_of,
    write_mutated_copy,
)
from suites.harness.helpers import ROOT, needs_vllm

#: vLLM's package layout, written out: each module of the table and its file under site-packages.
LAYOUT = {
    "vllm.transformers_utils.processors.nano_nemotron_vl": (
        "vllm/transformers_utils/processors/nano_nemotron_vl.py"
    ),
    "vllm.model_executor.models.radio": "vllm/model_executor/models/radio.py",
    "vllm.model_executor.models.parakeet": "vllm/model_executor/models/parakeet.py",
    "vllm.model_executor.models.nemotron_h": "vllm/model_executor/models/nemotron_h.py",
    "vllm.model_executor.models.nano_nemotron_vl": "vllm/model_executor/models/nano_nemotron_vl.py",
    "vllm.transformers_utils.configs.radio": "vllm/transformers_utils/configs/radio.py",
    "vllm.transformers_utils.configs.parakeet": "vllm/transformers_utils/configs/parakeet.py",
    "vllm.lora.peft_helper": "vllm/lora/peft_helper.py",
}
FILES = (
    MODEL_FILE,
    PROCESSOR_FILE,
    RADIO_FILE,
    PARAKEET_FILE,
    NEMOTRON_H_FILE,
    PEFT_HELPER_FILE,
)


def test_the_table_follows_vllms_layout():
    names = (*MODEL_FAMILY_MODULES, *CONFIG_MODULES)
    assert {name: file_of(name).as_posix() for name in names} == {
        name: LAYOUT[name] for name in names
    }
    # And back, from the hand-written layout: the module whose caches the reach map empties.
    assert {module_of(Path(path)): path for path in LAYOUT.values()} == LAYOUT
    assert MODEL_FAMILY_MODULES[-1] == MODEL_MODULE  # the VL model last
    assert {f.as_posix() for f in FILES} <= set(LAYOUT.values())
    assert BARE_FILE_NAMES == {
        "nano_nemotron_vl.py": "vllm.model_executor.models.nano_nemotron_vl",
        "radio.py": "vllm.model_executor.models.radio",
        "parakeet.py": "vllm.model_executor.models.parakeet",
        "nemotron_h.py": "vllm.model_executor.models.nemotron_h",
    }


@pytest.mark.parametrize("module", ["harness.model_files", "harness.jobs.gate"])
def test_imports_neither_torch_nor_vllm(module):
    """The gate and the table load in a fresh process without torch or vLLM (the gate runs on
    machines where importing them is slow, and only reads the installed files)."""
    probe = (
        f"import sys, {module}\n"
        "loaded = sorted(m for m in ('torch', 'vllm') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "", f"import {module} loaded {proc.stdout.strip()}"


@needs_vllm
@pytest.mark.vllm
@pytest.mark.parametrize("relative", sorted(set(LAYOUT.values())))
def test_every_file_of_the_table_is_installed(relative):
    path = installed_file(Path(relative))
    assert path.is_file(), path
    assert path.parts[-len(Path(relative).parts) :] == Path(relative).parts


@needs_vllm
@pytest.mark.vllm
def test_the_mutated_copy_keeps_vllms_layout(tmp_path):
    out = write_mutated_copy(MODEL_FILE, tmp_path, lambda text: text + "\n# mutated\n")
    assert out == tmp_path / "vllm/model_executor/models/nano_nemotron_vl.py"
    assert out.read_text() == installed_model_file().read_text() + "\n# mutated\n"
