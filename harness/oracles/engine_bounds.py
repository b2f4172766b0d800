"""Bounds on a served engine's log-probabilities, derived from measured error on every CPU
family the engine was calibrated on.

Glossary: a *comparison* (:data:`ENGINE_COMPARISONS`) is what is compared with what:

- ``reference | PATH``: the engine's log-probability of every prompt token against the fp32
  reference's, for prompts whose media take path ``PATH`` (``text`` for none); one sample is a
  prompt's largest absolute difference over its positions, in nats (one position off);
- ``reference-rms | PATH``: the same differences' root mean square over the prompt's positions
  (every position a little off);
- ``decode-vs-prefill``: a decoded token's log-probability against the same token's when the
  whole sequence is sent again as a prompt (the Mamba states and the KV cache carried across
  steps against one prefill);
- ``batched-vs-alone``: a request's log-probabilities inside a batch of mixed requests against
  the same request alone;
- ``chunked-vs-whole | PATH``: a request of path ``PATH`` whose prefill the scheduler splits
  (64-token chunks, a prefix read from the cache, a preempted request recomputed) against the
  same request prefilled in one step: the kernels see other shapes, and Mamba's state is carried
  across the split. Per path, because the split's error is heavy-tailed only where a request
  holds an image: measured on a CPU with AMX, the static-tile images' positions moved by up to
  0.32 nats while text-only requests stayed bit-exact but for one sample of 0.009; one bound for
  all paths would be blind on text to decode-state bugs the text requests show at 0.05.

A *family* (:func:`harness.machine.cpu_family`) is the kind of CPU kernels bf16 products run
on: ``avx2``, ``avx512``, ``amx``. Each family's calibration is one file of
:data:`ENGINE_CALIBRATION_DIR` (``<family>.json``: what ``nemotron-vl-calibrate-engine``
measured there, and the machine it ran on). A comparison's bound is derived from the samples of
every family at once (:meth:`EngineCalibration.bound`): the same bound on every machine, so no
verdict depends on the machine a run lands on. On a family no file holds, the bound is the
widest known (the pooled one, or any one family's own if wider), and :func:`machine_note` says
that this machine's verdicts are not backed by its own measurements.

Derivation (:func:`derive_engine_bound`): the log-normal fit of
:func:`harness.oracles.derivation.derive_bound` over the non-zero samples (a sample of 0 is a
bit-exact answer, not a point of an error distribution), never below
:data:`~harness.oracles.derivation.MARGIN_OVER_MAX` times the largest sample and never above
:data:`EXTRAPOLATION_LIMIT` times it (a fit of tens of samples read at 1 - 1e-6 extrapolates
far past what was measured: 14 times the largest sample for ``decode-vs-prefill``); where fewer
than :data:`~harness.oracles.derivation.MIN_SAMPLES` are non-zero among enough samples, the
margin over the largest; never below :data:`LOGPROB_FLOOR` nor above :data:`LOGPROB_CEILING`.

Standard library only: the report reads the bounds without torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT
from harness.machine import cpu_family
from harness.oracles.derivation import (
    MARGIN_OVER_MAX,
    MIN_SAMPLES,
    Bound,
    derive_bound,
    read_json_table,
)

#: One calibration file per CPU family: ``<family>.json``.
ENGINE_CALIBRATION_DIR = ROOT / "fixtures" / "calibration" / "engine"
#: The CPU families whose kernels give bf16 products different bits.
KNOWN_FAMILIES = ("avx2", "avx512", "amx")
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
#: The paths the scheduling engine is calibrated on (the static variant's), in the order the
#: calibration draws them.
SCHEDULED_PATHS = ("text", "image-static", "video-t1", "audio-hop-160", "audio-in-video")
ENGINE_COMPARISONS = (
    *(f"reference | {path}" for path in LOGPROB_PATHS),
    *(f"reference-rms | {path}" for path in LOGPROB_PATHS),
    "decode-vs-prefill",
    "batched-vs-alone",
    *(f"chunked-vs-whole | {path}" for path in SCHEDULED_PATHS),
)
#: The bound of a comparison without enough samples: a token's log-probability one nat off
#: (its probability 2.7 times too high or low) is no longer the same model, in any dtype.
LOGPROB_CEILING = 1.0
#: The least bound of a comparison: one bf16 rounding of a log-probability near 1 nat (2**-8).
#: Where every sample is 0 (this CPU's kernels gave a request in a batch bit for bit what they
#: gave it alone), a CPU whose kernels round a batch's products in another order still passes;
#: a request mixed up with another in the batch moves its log-probabilities by far more.
LOGPROB_FLOOR = 2.0**-8
#: A bound is at most this many times the largest sample of its comparison (pooled over the
#: families): what a fit may add past what was measured.
EXTRAPOLATION_LIMIT = 3.0


def derive_engine_bound(samples: Sequence[float]) -> Bound:
    """The bound of one comparison's ``samples`` (the module docstring's derivation)."""
    nonzero = [x for x in samples if x > 0]
    if len(samples) < MIN_SAMPLES:
        bound = derive_bound(samples, LOGPROB_CEILING)  # the ceiling, saying why
    elif len(nonzero) < MIN_SAMPLES:
        largest = max(samples)
        bound = Bound(
            min(MARGIN_OVER_MAX * largest, LOGPROB_CEILING),
            f"{len(samples) - len(nonzero)} of {len(samples)} samples exactly 0: "
            f"{MARGIN_OVER_MAX:g} x the largest sample ({largest:.3g})",
            len(samples),
            largest,
        )
    else:
        fitted = derive_bound(nonzero, float("inf"))
        largest = max(nonzero)
        limit = EXTRAPOLATION_LIMIT * largest
        value, method = fitted.value, f"{fitted.method} (non-zero samples)"
        if value > limit:
            value = limit
            method += f"; at most {EXTRAPOLATION_LIMIT:g} x the largest sample: {limit:.3g}"
        if value > LOGPROB_CEILING:
            value = LOGPROB_CEILING
            method += f"; capped at the ceiling {LOGPROB_CEILING:g}"
        bound = Bound(value, method, len(samples), largest)
    if bound.value < LOGPROB_FLOOR:
        return dataclasses.replace(
            bound,
            value=LOGPROB_FLOOR,
            method=f"{bound.method}; raised to the floor {LOGPROB_FLOOR:.3g}",
        )
    return bound


def _check_comparison(comparison: str) -> None:
    if comparison not in ENGINE_COMPARISONS:
        raise ValueError(
            f"engine bounds: comparison: expected one of {list(ENGINE_COMPARISONS)}, got "
            f"{comparison!r}"
        )


@dataclass(frozen=True)
class EngineTable:
    """What ``nemotron-vl-calibrate-engine`` measured on one machine: its samples per
    comparison, the machine (its ``family`` and how it was told), and the run (``about``)."""

    about: dict[str, object]
    machine: dict[str, object]
    samples: dict[str, list[float]]

    @property
    def family(self) -> str:
        return str(self.machine["family"])

    def bound(self, comparison: str) -> Bound:
        """``comparison``'s bound from this machine's samples alone."""
        _check_comparison(comparison)
        return derive_engine_bound(self.samples.get(comparison, []))


@dataclass(frozen=True)
class FamilySamples:
    """What one family's calibration holds of a comparison."""

    family: str
    count: int
    largest: float | None


@dataclass(frozen=True)
class EngineCalibration:
    """Every family's :class:`EngineTable`; a comparison's bound is derived from all of them."""

    tables: tuple[EngineTable, ...]

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(t.family for t in self.tables)

    def pooled(self, comparison: str) -> list[float]:
        """``comparison``'s samples of every family, one list."""
        _check_comparison(comparison)
        return [x for t in self.tables for x in t.samples.get(comparison, [])]

    def sources(self, comparison: str) -> list[FamilySamples]:
        """What each family contributes to ``comparison``'s bound."""
        _check_comparison(comparison)
        found = []
        for t in self.tables:
            samples = t.samples.get(comparison, [])
            found.append(FamilySamples(t.family, len(samples), max(samples, default=None)))
        return found

    def bound(self, comparison: str, family: str | None = None) -> Bound:
        """``comparison``'s bound, derived from every family's samples; on a ``family`` none
        of the tables holds, the widest of that and each family's own bound."""
        pooled = derive_engine_bound(self.pooled(comparison))
        described = ", ".join(f"{s.family} {s.count}" for s in self.sources(comparison) if s.count)
        bound = dataclasses.replace(pooled, method=f"{pooled.method}; samples: {described}")
        if family is None or family in self.families:
            return bound
        widest = max((t.bound(comparison) for t in self.tables), key=lambda b: b.value)
        if widest.value > bound.value:
            bound = dataclasses.replace(widest, method=f"{widest.method} (one family's own)")
        return dataclasses.replace(
            bound,
            method=f"{bound.method}; {family} never calibrated: the widest bound known",
        )


def _samples(where: str, samples: object) -> dict[str, list[float]]:
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
    return {k: [float(v) for v in vs] for k, vs in samples.items()}


def parse_engine_table(data: object, where: str) -> EngineTable:
    """An :class:`EngineTable` from the JSON object ``data`` (read from ``where``), every field
    checked, a bad one named."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the table: expected a JSON object, got {type(data).__name__}")
    about, machine = data.get("about"), data.get("machine")
    if not isinstance(about, dict):
        raise ValueError(f"{where}: about: expected an object, got {about!r}")
    if not isinstance(machine, dict) or not isinstance(machine.get("family"), str):
        raise ValueError(
            f"{where}: machine: expected an object with the CPU family ('family': one of "
            f"{list(KNOWN_FAMILIES)} or another name), got {machine!r}"
        )
    return EngineTable(dict(about), dict(machine), _samples(where, data.get("samples")))


def read_engine_table(path: Path) -> EngineTable:
    """The one machine's engine calibration table at ``path``."""
    data = read_json_table(path, "engine calibration table", "nemotron-vl-calibrate-engine")
    return parse_engine_table(data, str(path))


def read_engine_calibration(folder: Path = ENGINE_CALIBRATION_DIR) -> EngineCalibration:
    """Every family's table in ``folder`` (``<family>.json``), the file's name its family's."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(
            f"engine calibration: expected <family>.json files in {folder}, got none; run "
            "nemotron-vl-calibrate-engine --write (nox -s calibrate) to write this machine's"
        )
    tables = []
    for file in files:
        table = read_engine_table(file)
        if table.family != file.stem:
            raise ValueError(
                f"{file}: machine.family: expected {file.stem!r} (the file's name), got "
                f"{table.family!r}"
            )
        tables.append(table)
    return EngineCalibration(tuple(tables))


@functools.cache
def committed_calibration() -> EngineCalibration:
    """The committed calibration (:data:`ENGINE_CALIBRATION_DIR`), read once."""
    return read_engine_calibration()


@functools.cache
def this_family() -> str:
    """This machine's CPU family (:func:`harness.machine.cpu_family`)."""
    return cpu_family()


@functools.cache
def engine_bound(comparison: str) -> Bound:
    """The committed calibration's bound for ``comparison`` on this machine."""
    return committed_calibration().bound(comparison, this_family())


def engine_path_bound(comparison: str, paths: Iterable[str]) -> Bound:
    """The widest of ``comparison | PATH``'s bounds over ``paths`` (a request whose media take
    several paths takes the widest of theirs)."""
    bounds = [engine_bound(f"{comparison} | {path}") for path in paths]
    if not bounds:
        raise ValueError(f"engine bounds: paths: expected at least one for {comparison!r}")
    return max(bounds, key=lambda b: b.value)


#: The paths whose split-prefill error sits inside their own placeholder runs, heavy-tailed
#: there and not around them: measured on an AMX CPU, the 213-token mixed request prefilled in
#: 64-token chunks moved every position above 0.03 nats inside its static-tile image's run (up
#: to 0.164), the 12 decoded tokens at most 0.014 (``../shared/calibration/``, defect #63).
RUN_LOCALISED_PATHS = frozenset({"image-static"})


def split_prefill_bounds(paths: Iterable[str]) -> tuple[float, float]:
    """A split prefill's bounds for a request whose media take ``paths``: ``(inside, outside)``,
    the first for the positions inside the placeholder runs of a :data:`RUN_LOCALISED_PATHS`
    path (the widest of the request's paths' ``chunked-vs-whole`` bounds), the second for every
    other position and the decoded tokens (the widest of the other paths'; the first where the
    request has no other path: around an image alone, only the mixed request was measured, at
    up to 0.03 nats, above text's own bound)."""
    paths = tuple(paths)
    inside = engine_path_bound("chunked-vs-whole", paths).value
    others = [p for p in paths if p not in RUN_LOCALISED_PATHS]
    if not others:
        return inside, inside
    return inside, engine_path_bound("chunked-vs-whole", others).value


def engine_tie_bound(paths: Iterable[str]) -> float:
    """How close the reference's top-2 log-probabilities may be for an engine on ``paths`` to
    choose the runner-up honestly: twice the largest error of one prompt position the
    calibrations measured there (each of the two off by that much), measured rounding rather
    than the bound's extrapolation past it or the ceiling."""
    largest = [engine_bound(f"reference | {path}").largest_sample for path in paths]
    measured = [x for x in largest if x is not None]
    if not measured:
        raise ValueError(f"engine bounds: no calibration samples for the paths {list(paths)}")
    return 2 * max(measured)


def machine_note(calibration: EngineCalibration, family: str) -> str:
    """Which calibrations serve the bounds, and whether this machine's family is among them."""
    served = ", ".join(calibration.families)
    if family in calibration.families:
        return f"bounds from the calibrations of {served}; this machine: {family} (calibrated)"
    return (
        f"bounds from the calibrations of {served}; this machine: {family}, never calibrated: "
        "each bound is the widest known, and this machine's verdicts rest on other families' "
        "measurements (run nemotron-vl-calibrate-engine here)"
    )


@dataclass(frozen=True)
class Exceeded:
    """A calibration sample above the bound a check would judge it by."""

    family: str
    comparison: str
    sample: float
    bound: float


def replay(calibration: EngineCalibration, table: EngineTable) -> list[Exceeded]:
    """Every sample of ``table`` above ``calibration``'s bound of its comparison (for the
    table's family): what the checks would have failed on that machine."""
    found = []
    for comparison, samples in sorted(table.samples.items()):
        bound = calibration.bound(comparison, table.family).value
        found += [Exceeded(table.family, comparison, x, bound) for x in samples if x > bound]
    return found


def split_legacy_chunked(
    samples: Sequence[float], seeds: int, draws: int
) -> Mapping[str, list[float]]:
    """A single ``chunked-vs-whole`` list, as tables before the per-path split held it, by path.

    Its order is the calibration's: per weight seed, the static variant's requests split
    against prefilled whole, then the same requests in one preempting batch against alone; each
    half the :data:`SCHEDULED_PATHS` in order, ``draws`` requests each. Only a list of every
    request (none left out for its context) can be attributed."""
    per_half = len(SCHEDULED_PATHS) * draws
    if len(samples) != seeds * 2 * per_half:
        raise ValueError(
            f"chunked-vs-whole: expected {seeds} seeds x 2 x {per_half} samples, got "
            f"{len(samples)} (a request left out for its context cannot be attributed)"
        )
    by_path: dict[str, list[float]] = {path: [] for path in SCHEDULED_PATHS}
    for start in range(0, len(samples), per_half):
        half = samples[start : start + per_half]
        for k, path in enumerate(SCHEDULED_PATHS):
            by_path[path] += half[k * draws : (k + 1) * draws]
    return by_path


def bounds_table(calibration: EngineCalibration, family: str) -> list[str]:
    """The report's table of the engine's bounds: per comparison, the bound on this machine,
    each family's samples and largest, and the bound's ratio to the largest sample; then which
    calibrations serve them (:func:`machine_note`)."""
    lines = [
        machine_note(calibration, family),
        "",
        "| comparison | bound | samples by family (largest) | bound / largest |",
        "|---|---|---|---|",
    ]
    for comparison in ENGINE_COMPARISONS:
        bound = calibration.bound(comparison, family)
        sources = ", ".join(
            f"{s.family} {s.count} ({s.largest:.3g})"
            for s in calibration.sources(comparison)
            if s.largest is not None
        )
        largest = max(calibration.pooled(comparison), default=0.0)
        ratio = f"{bound.value / largest:.2f}" if largest > 0 else "every sample exact"
        named = comparison.replace("|", "\\|")
        lines.append(f"| {named} | {bound.value:.4g} | {sources} | {ratio} |")
    return lines
