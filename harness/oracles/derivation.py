"""How a bound is derived from measured error: the method both the tower parity bounds
(:mod:`harness.oracles.bounds`) and the engine's log-probability bounds
(:mod:`harness.oracles.engine_bounds`) share. Standard library only: the report reads the engine
bounds without torch.

1. a log-normal fit: ``exp(mu + z * sigma)`` of the samples' logarithms, with ``z`` the normal
   quantile of ``1 - FALSE_FAILURE_PER_COMPARISON`` (1e-6: a main job makes a few hundred such
   comparisons, so an honest run fails by chance about once in a thousand runs or less);
2. never below :data:`MARGIN_OVER_MAX` times the largest sample (no calibrated input sits at
   the edge);
3. never above the ceiling, which also stands for fewer than :data:`MIN_SAMPLES` samples.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The chance that one comparison of an honest implementation exceeds its fitted bound.
FALSE_FAILURE_PER_COMPARISON = 1e-6
#: A bound is at least this many times the largest calibration sample.
MARGIN_OVER_MAX = 1.5
#: Fewer samples than this and a cell keeps the analytic ceiling.
MIN_SAMPLES = 20


@dataclass(frozen=True)
class Bound:
    """One statistic's bound for one cell, with how it was derived."""

    value: float
    method: str
    samples: int = 0
    largest_sample: float | None = None


def derive_bound(samples: Sequence[float], ceiling: float) -> Bound:
    """The bound of a cell's ``samples`` of one statistic (the module docstring's method)."""
    n = len(samples)
    if n < MIN_SAMPLES:
        return Bound(
            ceiling,
            f"analytic ceiling {ceiling:.3g} ({n} samples, at least {MIN_SAMPLES} to derive one)",
            n,
            max(samples) if samples else None,
        )
    logs = [math.log(max(x, 1e-30)) for x in samples]
    mu, sigma = statistics.fmean(logs), statistics.stdev(logs)
    z = statistics.NormalDist().inv_cdf(1 - FALSE_FAILURE_PER_COMPARISON)
    fitted = math.exp(mu + z * sigma)
    largest = max(samples)
    floor = MARGIN_OVER_MAX * largest
    derived = max(fitted, floor)
    how = (
        f"log-normal fit of {n} samples (median {math.exp(mu):.3g}, geometric sd "
        f"x{math.exp(sigma):.3g}) at 1 - {FALSE_FAILURE_PER_COMPARISON:g}: {fitted:.3g}; "
        f"{MARGIN_OVER_MAX:g} x the largest sample: {floor:.3g}"
    )
    if derived > ceiling:
        return Bound(ceiling, f"{how}; capped at the analytic ceiling {ceiling:.3g}", n, largest)
    return Bound(derived, how, n, largest)


def read_json_table(path: Path, what: str, command: str) -> object:
    """The JSON of the calibration table ``what`` at ``path``; a missing file names the
    ``command`` that writes it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{what}: expected a file at {path}; run {command} (nox -s calibrate) to write one"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: expected JSON, got a parse error: {e}") from e
