"""Bounds on a served engine's log-probabilities, derived from measured error as the tower
bounds are (:func:`harness.oracles.bounds.derive_bound`).

Glossary: a *comparison* (:data:`ENGINE_COMPARISONS`) is what is compared with what:

- ``reference | PATH``: the engine's log-probability of every prompt token against the fp32
  reference's, for prompts whose media take path ``PATH`` (``text`` for none); one sample is a
  prompt's largest absolute difference over its positions, in nats (one position off);
- ``reference-rms | PATH``: the same differences' root mean square over the prompt's positions
  (every position a little off: the largest is heavy-tailed, a few positions after an image
  move far in bf16, and so its bound is wide);
- ``decode-vs-prefill``: a decoded token's log-probability against the same token's when the
  whole sequence is sent again as a prompt (the Mamba states and the KV cache carried across
  steps against one prefill);
- ``batched-vs-alone``: a request's log-probabilities inside a batch of mixed requests against
  the same request alone;
- ``chunked-vs-whole``: a request whose prefill the scheduler splits (64-token chunks, a prefix
  read from the cache, a preempted request recomputed) against the same request prefilled in
  one step: the kernels see other shapes, and Mamba's state is carried across the split.

A greedy token may differ from the reference's only where the reference's own top-2 margin is
within twice the path's bound (each of the two log-probabilities may be off by the bound).

The samples come from ``nemotron-vl-calibrate-engine`` (:mod:`harness.jobs.calibrate_engine`)
and are committed in :data:`ENGINE_CALIBRATION_TABLE`. Fewer than
:data:`~harness.oracles.bounds.MIN_SAMPLES` samples, or none, and a comparison keeps
:data:`LOGPROB_CEILING`; no bound is below :data:`LOGPROB_FLOOR`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT
from harness.oracles.bounds import (
    MARGIN_OVER_MAX,
    MIN_SAMPLES,
    Bound,
    derive_bound,
    read_json_table,
)

ENGINE_CALIBRATION_TABLE = ROOT / "fixtures" / "calibration" / "engine.json"
#: The prompt paths whose log-probabilities are compared with the reference's.
LOGPROB_PATHS = (
    "text",
    "image-static",
    "image-dynamic",
    "video-t1",
    "video-t2",
    "video-evs",
    "audio-hop-160",
    "audio-in-video",
)
ENGINE_COMPARISONS = (
    *(f"reference | {path}" for path in LOGPROB_PATHS),
    *(f"reference-rms | {path}" for path in LOGPROB_PATHS),
    "decode-vs-prefill",
    "batched-vs-alone",
    "chunked-vs-whole",
)
#: The bound of a comparison without enough samples: a token's log-probability one nat off
#: (its probability 2.7 times too high or low) is no longer the same model, in any dtype.
LOGPROB_CEILING = 1.0
#: The least bound of a comparison: one bf16 rounding of a log-probability near 1 nat (2**-8).
#: Where every sample is 0 (this CPU's kernels gave a request in a batch bit for bit what they
#: gave it alone), a CPU whose kernels round a batch's products in another order still passes;
#: a request mixed up with another in the batch moves its log-probabilities by far more.
LOGPROB_FLOOR = 2.0**-8


@dataclass(frozen=True)
class EngineTable:
    """The samples ``nemotron-vl-calibrate-engine`` measured, per comparison."""

    about: dict[str, object]
    samples: dict[str, list[float]]

    def bound(self, comparison: str) -> Bound:
        """``comparison``'s bound: :func:`~harness.oracles.bounds.derive_bound` over its
        non-zero samples (a sample of 0 is a bit-exact answer, not a point of an error
        distribution); where fewer than :data:`~harness.oracles.bounds.MIN_SAMPLES` are
        non-zero among enough samples, the largest times
        :data:`~harness.oracles.bounds.MARGIN_OVER_MAX`; never below :data:`LOGPROB_FLOOR`."""
        if comparison not in ENGINE_COMPARISONS:
            raise ValueError(
                f"engine bounds: comparison: expected one of {list(ENGINE_COMPARISONS)}, got "
                f"{comparison!r}"
            )
        samples = self.samples.get(comparison, [])
        nonzero = [x for x in samples if x > 0]
        if len(samples) >= MIN_SAMPLES and len(nonzero) < MIN_SAMPLES:
            largest = max(samples)
            bound = Bound(
                min(MARGIN_OVER_MAX * largest, LOGPROB_CEILING),
                f"{len(samples) - len(nonzero)} of {len(samples)} samples exactly 0: "
                f"{MARGIN_OVER_MAX:g} x the largest sample ({largest:.3g})",
                len(samples),
                largest,
            )
        else:
            bound = derive_bound(
                nonzero if len(nonzero) >= MIN_SAMPLES else samples, LOGPROB_CEILING
            )
        if bound.value < LOGPROB_FLOOR:
            return dataclasses.replace(
                bound,
                value=LOGPROB_FLOOR,
                method=f"{bound.method}; raised to the floor {LOGPROB_FLOOR:.3g}",
            )
        return bound


def parse_engine_table(data: object, where: str) -> EngineTable:
    """An :class:`EngineTable` from the JSON object ``data`` (read from ``where``), every field
    checked, a bad one named."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the table: expected a JSON object, got {type(data).__name__}")
    about, samples = data.get("about"), data.get("samples")
    if not isinstance(about, dict):
        raise ValueError(f"{where}: about: expected an object, got {about!r}")
    if not isinstance(samples, dict):
        raise ValueError(
            f"{where}: samples: expected an object keyed by comparison, got {samples!r}"
        )
    for key, values in samples.items():
        if key not in ENGINE_COMPARISONS:
            raise ValueError(
                f"{where}: samples[{key!r}]: expected a comparison of "
                f"{list(ENGINE_COMPARISONS)}, got {key!r}"
            )
        if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values
        ):
            raise ValueError(
                f"{where}: samples[{key!r}]: expected a list of errors >= 0, got {values!r}"
            )
    return EngineTable(dict(about), {k: [float(v) for v in vs] for k, vs in samples.items()})


def read_engine_table(path: Path = ENGINE_CALIBRATION_TABLE) -> EngineTable:
    """The engine calibration table at ``path``."""
    data = read_json_table(path, "engine calibration table", "nemotron-vl-calibrate-engine")
    return parse_engine_table(data, str(path))


@functools.cache
def engine_bound(comparison: str) -> Bound:
    """The committed table's bound for ``comparison``."""
    return read_engine_table().bound(comparison)
