"""Prefill and decode throughput of the reference's layers at the published widths, in bf16 on
CUDA, against the GPU's bf16 peak.

``nemotron-vl-gpu-throughput [--out reports/gpu/throughput.json]``: for each layer of
:func:`harness.gpu.real_widths.layer_cases`,

- prefill: one sequence of ``--prefill`` tokens (default 2048) through the block;
- decode: ``--decode-batch`` sequences (default 64), each with a ``--context``-token prefix
  (default 512) already in the cache, one token each per step; stateless layers (MLP, MoE)
  see one token per sequence.

Each is timed: the median of ``--repeats`` runs after one warm-up, the GPU synchronised around
each. The work done is counted, not estimated: the matmul FLOPs the block's forward executed,
from PyTorch's ``FlopCounterMode`` on the same call. Achieved TFLOP/s = FLOPs / median time;
the share of the peak uses :data:`BF16_DENSE_PEAK_TFLOPS` (NVIDIA's datasheets, dense, no
sparsity) for the device's name, and is left out for a GPU not in that table.

The reference is a readable model, not a fast one: the numbers say where it stands, they are
not a goal. ``--device cpu`` runs the same measurement on the CPU (to try the script; no peak).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.gpu.real_widths import STATEFUL, LayerCase, build_block, layer_cases
from reference_impl.nemotron_h import Block

#: bf16 dense tensor-core peak by (a part of) the device name, from NVIDIA's datasheets.
BF16_DENSE_PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0,  # H200 SXM; the datasheet's 1,979 is with sparsity
    "H100 80GB HBM3": 989.0,  # H100 SXM
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "A100": 312.0,
    "L40S": 362.0,
    "B200": 2250.0,
}


def peak_tflops(device_name: str) -> float | None:
    for part, peak in BF16_DENSE_PEAK_TFLOPS.items():
        if part in device_name:
            return peak
    return None


def timed(step: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median seconds of ``step`` over ``repeats`` runs after one warm-up, the device
    synchronised around each."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def counted_flops(step: Callable[[], Any]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return int(counter.get_total_flops())


def measure(
    case: LayerCase, args: argparse.Namespace, device: torch.device, peak: float | None
) -> dict[str, Any]:
    block: Block = build_block(case, device=device.type).to(torch.bfloat16)
    hidden = case.config().hidden_size
    g = torch.Generator(device=device).manual_seed(0)
    rows: dict[str, Any] = {"layer": case.id}
    with torch.no_grad():
        prompt = torch.randn(1, args.prefill, hidden, generator=g, device=device).bfloat16()

        def prefill() -> Any:
            return block(prompt)

        batch = args.decode_batch
        token = torch.randn(batch, 1, hidden, generator=g, device=device).bfloat16()
        if case.kind in STATEFUL:
            capacity = args.context + 1
            prefix = torch.randn(batch, args.context, hidden, generator=g, device=device)
            cache = block.mixer.new_cache(batch, capacity, device, torch.bfloat16)
            block(prefix.bfloat16(), cache)
            positions = torch.full((batch,), args.context, device=device)
            # Each step writes the same position: the state a step leaves is the next's input,
            # the attention cache does not grow (the timing is of one step at this context).

            def decode() -> Any:
                return block(token, cache, positions=positions)
        else:

            def decode() -> Any:
                return block(token)

        for phase, step, tokens in (("prefill", prefill, args.prefill), ("decode", decode, batch)):
            seconds = timed(step, args.repeats, device)
            flops = counted_flops(step)
            achieved = flops / seconds / 1e12
            rows[phase] = {
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
                "flops": flops,
                "tflops": achieved,
                "share_of_peak": achieved / peak if peak else None,
            }
    return rows


def table(report: dict[str, Any]) -> str:
    peak = report["peak_bf16_dense_tflops"]
    if report["device"] == "cpu":
        heading = "cpu: a trial run, no bf16 peak"
    elif peak:
        heading = f"{report['device']}: bf16 dense peak {peak:.0f} TFLOP/s"
    else:
        heading = f"{report['device']}: bf16 dense peak unknown (not in the table)"
    lines = [
        heading,
        "| layer | prefill tok/s | prefill TFLOP/s | decode tok/s | decode TFLOP/s |",
        "|---|---|---|---|---|",
    ]
    for row in report["layers"]:
        cells = []
        for phase in ("prefill", "decode"):
            entry = row[phase]
            share = entry["share_of_peak"]
            note = f" ({share:.1%})" if share is not None else ""
            cells += [f"{entry['tokens_per_s']:,.0f}", f"{entry['tflops']:.1f}{note}"]
        lines.append(f"| {row['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-gpu-throughput", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("reports/gpu/throughput.json"))
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="layers whose id contains this text")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    for name in ("prefill", "context", "decode_batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive count")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "harness.gpu.throughput: --device cuda, but no CUDA device is visible "
            "(torch.cuda.is_available() is False)",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = peak_tflops(name) if device.type == "cuda" else None
    cases = [case for case in layer_cases() if args.only in case.id]
    if not cases:
        parser.error(f"--only: no layer id contains {args.only!r}")
    layers = []
    for case in cases:
        layers.append(measure(case, args, device, peak))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "device": name,
        "torch": torch.__version__,
        "peak_bf16_dense_tflops": peak,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "layers": layers,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
