"""The throughput report's machinery on the CPU: the FLOPs it counts equal the architecture's
count, its report holds what it promises, and without CUDA it refuses clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.gpu import throughput as gpu_throughput
from harness.gpu.real_widths import layer_cases, text_config


def test_counted_flops_are_the_mlp_formula(tmp_path: Path) -> None:
    """An MLP token costs two matmuls of H x F (up and down, no gate): ``4 H F`` FLOPs;
    12B v2: H 5120, F 20480."""
    out = tmp_path / "throughput.json"
    argv = ["--device", "cpu", "--only", "12b-v2-mlp", "--prefill", "8", "--context", "4"]
    argv += ["--decode-batch", "2", "--repeats", "1", "--out", str(out)]
    assert gpu_throughput.main(argv) == 0
    report = json.loads(out.read_text())
    text = text_config("12b-v2")
    per_token = 4 * text.hidden_size * text.mlp_width(1)
    (row,) = report["layers"]
    assert row["layer"] == "12b-v2-mlp"
    assert row["prefill"]["flops"] == 8 * per_token
    assert row["decode"]["flops"] == 2 * per_token
    for phase in ("prefill", "decode"):
        entry = row[phase]
        assert entry["seconds"] > 0
        assert entry["tflops"] == pytest.approx(entry["flops"] / entry["seconds"] / 1e12)
        assert entry["share_of_peak"] is None  # a CPU run has no peak


def test_every_layer_kind_of_both_presets() -> None:
    assert [case.id for case in layer_cases()] == [
        "12b-v2-mamba",
        "12b-v2-mlp",
        "12b-v2-attention",
        "omni-mamba",
        "omni-moe",
        "omni-attention",
    ]


def test_peak_by_device_name() -> None:
    assert gpu_throughput.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_throughput.peak_tflops("Some Other GPU") is None


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_throughput.main([]) == 2
    assert "--device cuda, but no CUDA device is visible" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--prefill", "--decode-batch", "--repeats"])
def test_counts_must_be_positive(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_throughput.main([flag, "0"])
    assert f"{flag}: expected a positive count" in capsys.readouterr().err
