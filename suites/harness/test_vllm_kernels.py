"""The kernel checks' own machinery: vLLM's launch metadata as we rebuild it (hand-worked tables),
the files route's refusals, the bundle, and mutants of vLLM's kernel files that the kernel checks
must fail (made here from the installed files, in a temporary folder).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.gpu import bundle as gpu_bundle
from harness.gpu import kernels as vllm_kernels
from harness.gpu.kernels import (
    KERNEL_FILES,
    KernelLoadError,
    chunk_layout,
    conv_programs,
    installed_ops_folder,
    load_files,
    slot_constants,
)
from suites.gpu import test_vllm_mamba_kernels as checks

pytestmark = pytest.mark.vllm

OPS = installed_ops_folder()
needs_vllm = pytest.mark.skipif(OPS is None, reason="needs the installed vLLM's kernel files")


def test_chunk_layout_hand_worked() -> None:
    """Chunk size 4; sequences of 1 (fresh), 7 (2 computed) and 3 (4 computed) tokens: the
    second starts with a 2-token chunk up to absolute position 4, then 4, then 1; the third is
    aligned and fits one chunk."""
    layout = chunk_layout(4, [1, 7, 3], [0, 2, 4])
    assert layout.cu_seqlens == [0, 1, 8, 11]
    assert layout.cu_chunk_seqlens == [0, 1, 3, 7, 8, 11]
    assert layout.seq_idx == [0, 1, 1, 1, 2]
    assert layout.last_chunk_indices == [0, 3, 4]


def test_conv_programs_hand_worked() -> None:
    """Sequences of 1, 8 and 20 tokens in blocks of 8: 1 + 1 + 3 programs; the table is padded
    by one ``PAD_SLOT_ID`` entry."""
    table = conv_programs(torch.tensor([0, 1, 9, 29], dtype=torch.int32), pad_slot_id=-1)
    entry = table.nums_dict[8]
    assert entry["tot"] == 5
    assert table.batch_ptr.tolist() == [0, 1, 2, 2, 2, -1]
    assert table.token_chunk_offset_ptr.tolist() == [0, 0, 0, 1, 2, -1]


def kernel_copy(tmp_path: Path) -> Path:
    assert OPS is not None
    return gpu_bundle.copy_kernel_files(tmp_path, OPS)


@needs_vllm
def test_slot_constants_are_vllms(tmp_path: Path) -> None:
    """Read from vLLM's file, they are what vLLM's module defines."""
    from vllm.v1.attention.backends import utils

    copy = kernel_copy(tmp_path)
    assert slot_constants(copy) == {
        "NULL_BLOCK_ID": utils.NULL_BLOCK_ID,
        "PAD_SLOT_ID": utils.PAD_SLOT_ID,
    }


@needs_vllm
def test_missing_kernel_file_is_named(tmp_path: Path) -> None:
    copy = kernel_copy(tmp_path)
    (copy / "ssd_bmm.py").unlink()
    with pytest.raises(KernelLoadError, match=r"missing \['ssd_bmm.py'\]"):
        load_files(copy, interpret=True)


@needs_vllm
def test_missing_slot_constants_are_named(tmp_path: Path) -> None:
    copy = kernel_copy(tmp_path)
    (tmp_path / "vllm/v1/attention/backends/utils.py").write_text("PAD_SLOT_ID = -1\n")
    with pytest.raises(KernelLoadError, match=r"assignments of \['NULL_BLOCK_ID'\]"):
        load_files(copy, interpret=True)


def test_kernel_source_must_be_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KERNELS_SOURCE", str(tmp_path / "absent"))
    monkeypatch.setattr(vllm_kernels, "_LOADED", {})
    with pytest.raises(KernelLoadError, match=r"VLLM_KERNELS_SOURCE: expected the folder .* got '"):
        vllm_kernels.load(interpret=True)


@needs_vllm
def test_bundle_kernels_only(tmp_path: Path) -> None:
    """The bundle holds every kernel file, and its manifest counts what it wrote."""
    manifest = gpu_bundle.make(tmp_path / "bundle", with_package=False)
    ops = tmp_path / "bundle/vllm-kernels/vllm" / gpu_bundle.OPS_IN_PACKAGE
    assert sorted(p.name for p in ops.glob("*.py")) == sorted(KERNEL_FILES)
    assert json.loads((tmp_path / "bundle/bundle.json").read_text()) == manifest
    sizes = manifest["sizes_bytes"]
    assert isinstance(sizes, dict)
    assert manifest["total_bytes"] == sizes["vllm-kernels"]


def no_property(name: str, value: object) -> None:
    """``record_property`` for a check called outside pytest's own run."""


CPU = torch.device("cpu")
FP32 = torch.float32


def run_scan(kernels: Any) -> None:
    checks.test_chunked_scan_matches_reference(kernels, checks.SMALL, FP32, CPU, no_property)


def run_update(kernels: Any) -> None:
    checks.test_state_update_matches_reference(kernels, checks.SMALL, FP32, CPU, no_property)


def run_conv(kernels: Any) -> None:
    checks.test_causal_conv_prefill_matches_reference(
        kernels, checks.SMALL, FP32, "SD", CPU, no_property
    )


def run_conv_update(kernels: Any) -> None:
    checks.test_causal_conv_update_matches_reference(
        kernels, checks.SMALL, FP32, "SD", CPU, no_property
    )


#: ``(file, vLLM's text, its mutant, the check that must fail)``: each a plausible kernel bug.
MUTANTS: dict[str, tuple[str, str, str, Callable[[Any], None]]] = {
    "scan-drops-D": ("ssd_chunk_scan.py", "acc += x_residual * D", "acc += 0 * D", run_scan),
    "scan-ignores-initial-states": (
        "ssd_state_passing.py",
        "HAS_INITSTATES=initial_states is not None",
        "HAS_INITSTATES=False",
        run_scan,
    ),
    "update-drops-D": ("mamba_ssm.py", "out += x * D", "out += 0 * D", run_update),
    "conv-prefill-without-silu": (
        "causal_conv1d.py",
        "        if SILU_ACTIVATION:\n            acc = acc / (1 + tl.exp(-acc))",
        "        if SILU_ACTIVATION:\n            acc = acc",
        run_conv,
    ),
}


@needs_vllm
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_kernel_checks_fail_mutated_kernels(mutant: str, tmp_path: Path) -> None:
    file, original, mutated, check = MUTANTS[mutant]
    copy = kernel_copy(tmp_path)
    text = (copy / file).read_text()
    assert text.count(original) >= 1, f"vLLM's {file} no longer holds {original!r}"
    # The first occurrence: for the conv, the prefill kernel (the update kernel comes later).
    (copy / file).write_text(text.replace(original, mutated, 1))
    with pytest.raises(AssertionError):
        check(load_files(copy, interpret=True))


@needs_vllm
def test_kernel_checks_pass_an_unmutated_copy(tmp_path: Path) -> None:
    """The same checks on an unmutated copy pass: the mutants fail for their mutation."""
    kernels = load_files(kernel_copy(tmp_path), interpret=True)
    for check in (run_scan, run_update, run_conv, run_conv_update):
        check(kernels)
