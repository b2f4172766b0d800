"""Parity bounds derived from measured error: per path, per served dtype, per statistic.

An honest implementation's tower rows differ from the fp32 reference's by its own rounding; how
much depends on the path (the tower, the tiler, the hop) and on the dtype it computes in. One
bound for every bf16 path (the analytic ceiling, 16 unit roundoffs: 6.25 %) is 4 to 15 times
what the paths measure, so a regression that moves rows by a few percent passes. Here each path
gets the bound its own measured errors support.

Glossary: a *path* (:func:`parity_path`) is the tower route an item's rows take
(``image-static``, ``video-evs``, ``audio-hop-128``, ..., ``connector``); a *cell* is a path
served in one dtype from a checkpoint saved in one dtype; a *statistic* is one way to measure an
item's error (:data:`STATISTICS`):

- ``global``: ``||a - e|| / ||e||`` over the item's tower rows (Frobenius);
- ``row``: the largest row's error, ``max_r ||a_r - e_r||``, over the root-mean-square row
  norm ``||e|| / sqrt(n)``: one position (a tile's row, a frame's first token) off while the
  others are right;
- ``channel``: the same per hidden channel, over ``||e|| / sqrt(C)``: one channel off.

Rows no tower computes are not a path: given embeddings and a video's separator rows must come
back bit-exact (:mod:`harness.oracles.rows`), a bound of 0 that needs no calibration.

Row and channel errors are measured against the typical row's (channel's) size, not each one's
own: a channel of near-zero values would make its own relative error rounding noise over
nothing (measured: up to 14 % in bf16 for channels of honest rows).

The samples come from ``nemotron-vl-calibrate`` (:mod:`harness.jobs.calibrate`): vLLM against
the reference over drawn weights and media, committed in :data:`CALIBRATION_TABLE`. A bound is
derived from a cell's samples by :func:`derive_bound`:

1. a log-normal fit: ``exp(mu + z * sigma)`` of the samples' logarithms, with ``z`` the normal
   quantile of ``1 - FALSE_FAILURE_PER_COMPARISON`` (1e-6: a main job makes a few hundred such
   comparisons, so an honest run fails by chance about once in a thousand runs or less);
2. never below :data:`MARGIN_OVER_MAX` times the largest sample (no calibrated input sits at
   the edge);
3. never above the analytic ceiling (:func:`harness.oracles.parity.rounding_ceiling`), which
   also stands for a cell with fewer than :data:`MIN_SAMPLES` samples or none (a configuration
   the calibrated vLLM could not serve: the table says why).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from harness import ROOT
from harness.checkpoints.spec import ModelSpec
from harness.oracles.derivation import (
    FALSE_FAILURE_PER_COMPARISON,
    MARGIN_OVER_MAX,
    MIN_SAMPLES,
    Bound,
    derive_bound,
    read_json_table,
)
from harness.oracles.parity import rounding_ceiling

__all__ = [
    "FALSE_FAILURE_PER_COMPARISON",
    "MARGIN_OVER_MAX",
    "MIN_SAMPLES",
    "Bound",
    "derive_bound",
    "read_json_table",
]

#: The committed calibration: ``nemotron-vl-calibrate`` writes it.
CALIBRATION_TABLE = ROOT / "fixtures" / "calibration" / "parity.json"
#: The same per tower shape the covering array's variants have besides the default one
#: (``nemotron-vl-calibrate --shapes``), bf16 served from bf16: ``<shape slug>.json``.
SHAPES_DIR = ROOT / "fixtures" / "calibration" / "shapes"
#: The spec fields that make a tower shape: fewer rows per item or a narrower connector spread
#: the largest row and channel errors differently.
SHAPE_FIELDS = ("image_size", "projector_hidden_size", "num_mel_bins", "hidden_size", "sound_sizes")
Statistic = Literal["global", "row", "channel"]
#: The ways an item's error is measured (see the module docstring).
STATISTICS: tuple[Statistic, ...] = ("global", "row", "channel")

#: Every parity path, with what its rows go through.
PARITY_PATHS: dict[str, str] = {
    "image-static": "RADIO on static tiles and the thumbnail, pixel shuffle, mlp1",
    "image-dynamic": "RADIO at dynamic resolution, pixel shuffle, mlp1",
    "image-mtp": "static tiles with vision_final_layernorm before the pixel shuffle (MTP)",
    "video-t1": "RADIO per frame (T = 1), mlp1",
    "video-t2": "RADIO per tubelet of two frames (T = 2), mlp1",
    "video-evs": "video at T = 1 with EVS pruning the repeated groups",
    "video-evs-t2": "video at T = 2 with EVS pruning the repeated tubelets",
    "audio-hop-160": "the log-mel front end at hop 160, Parakeet, the sound projection",
    "audio-hop-128": "the same at hop 128",
    "audio-no-conv-bias": "Parakeet without convolution biases (Omni's form)",
    "audio-in-video": "a video file's audio track through the audio path at hop 160",
    "connector": "pixel shuffle and mlp1 on given vision features",
}


def parity_path(spec: ModelSpec, modality: str, *, audio_in_video: bool = False) -> str:
    """The path the tower rows of a ``modality`` item take on ``spec``'s checkpoint."""
    if modality == "image":
        if spec.dynamic_resolution:
            return "image-dynamic"
        return "image-mtp" if spec.mtp else "image-static"
    if modality == "video":
        t2 = spec.video_temporal_patch_size == 2
        if spec.video_pruning_rate > 0:
            return "video-evs-t2" if t2 else "video-evs"
        return "video-t2" if t2 else "video-t1"
    if modality == "audio":
        if audio_in_video:
            return "audio-in-video"
        if not spec.audio_convolution_bias:
            return "audio-no-conv-bias"
        return f"audio-hop-{spec.audio_hop_length}"
    raise ValueError(f"parity_path: modality: expected image, video or audio, got {modality!r}")


def error_statistics(actual: torch.Tensor, expected: torch.Tensor) -> dict[Statistic, float]:
    """Each of :data:`STATISTICS` for rows ``actual`` against ``expected`` (same shape; the last
    dimension the channels, every other one flattened into rows), in fp64."""
    if actual.shape != expected.shape:
        raise ValueError(
            f"error_statistics: expected rows of one shape, got {tuple(actual.shape)} and "
            f"{tuple(expected.shape)}"
        )
    width = expected.shape[-1] if expected.dim() else 1
    e = expected.detach().double().cpu().reshape(-1, width)
    d = actual.detach().double().cpu().reshape(-1, width) - e
    if not e.numel():
        return {"global": 0.0, "row": 0.0, "channel": 0.0}
    size = float(e.norm().clamp_min(1e-30))
    rows, channels = e.shape
    return {
        "global": float(d.norm()) / size,
        "row": float(d.norm(dim=1).max()) / (size / rows**0.5),
        "channel": float(d.norm(dim=0).max()) / (size / channels**0.5),
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cell_key(path: str, served: str, saved: str) -> str:
    """A cell's key in the table: ``path | served-<dtype> | saved-<dtype>``."""
    return f"{path} | served-{served} | saved-{saved}"


@dataclass(frozen=True)
class CellBounds:
    """A cell's bound per statistic, and where its samples came from."""

    bounds: Mapping[Statistic, Bound]
    source: str

    def __getitem__(self, statistic: Statistic) -> Bound:
        return self.bounds[statistic]


@dataclass(frozen=True)
class CalibrationTable:
    """The samples ``nemotron-vl-calibrate`` measured, per cell and statistic."""

    about: dict[str, object]
    samples: dict[str, dict[Statistic, list[float]]]
    not_calibrated: dict[str, str]  # cell key -> why it has no samples
    #: why a cell with no samples and no entry in ``not_calibrated`` has none
    uncalibrated: str = "no calibration samples for this cell"

    def bounds(self, path: str, served: torch.dtype, saved: str) -> CellBounds:
        """``path``'s bounds served in ``served`` from a checkpoint saved in ``saved``."""
        if path not in PARITY_PATHS:
            raise ValueError(
                f"parity bounds: path: expected one of {sorted(PARITY_PATHS)}, got {path!r}"
            )
        key = cell_key(path, dtype_name(served), saved)
        ceiling = rounding_ceiling(served)
        cell = self.samples.get(key)
        if cell is None:
            why = self.not_calibrated.get(key, self.uncalibrated)
            source = f"not calibrated: {why}"
            ceiling_only = Bound(ceiling, f"analytic ceiling {ceiling:.3g} ({source})")
            return CellBounds(dict.fromkeys(STATISTICS, ceiling_only), source)
        derived = {s: derive_bound(cell[s], ceiling) for s in STATISTICS}
        source = f"calibrated on {self.about.get('vllm', 'vLLM')}: {len(cell['global'])} samples"
        return CellBounds(derived, source)


def _field_error(where: str, field: str, expected: str, got: object) -> ValueError:
    return ValueError(f"{where}: {field}: expected {expected}, got {got!r}")


def parse_table(data: object, where: str) -> CalibrationTable:
    """A :class:`CalibrationTable` from the JSON object ``data`` (read from ``where``);
    every field checked, a bad one named."""
    if not isinstance(data, dict):
        raise _field_error(where, "the table", "a JSON object", type(data).__name__)
    about = data.get("about")
    if not isinstance(about, dict):
        raise _field_error(where, "about", "an object", about)
    cells = data.get("cells")
    if not isinstance(cells, dict):
        raise _field_error(where, "cells", "an object keyed by cell", cells)
    samples: dict[str, dict[Statistic, list[float]]] = {}
    for key, cell in cells.items():
        path = key.split(" | ")[0]
        if path not in PARITY_PATHS or len(key.split(" | ")) != 3:
            raise _field_error(
                where, f"cells[{key!r}]", "a key 'path | served-<dtype> | saved-<dtype>'", key
            )
        if not isinstance(cell, dict):
            raise _field_error(where, f"cells[{key!r}]", "an object of statistics", cell)
        parsed: dict[Statistic, list[float]] = {}
        for statistic in STATISTICS:
            values = cell.get(statistic)
            if not isinstance(values, list) or not all(
                isinstance(v, int | float) and v >= 0 for v in values
            ):
                raise _field_error(
                    where, f"cells[{key!r}].{statistic}", "a list of errors >= 0", values
                )
            parsed[statistic] = [float(v) for v in values]
        if len({len(v) for v in parsed.values()}) != 1:
            raise _field_error(
                where,
                f"cells[{key!r}]",
                "as many samples of each statistic",
                {s: len(v) for s, v in parsed.items()},
            )
        samples[key] = parsed
    not_calibrated = data.get("not_calibrated", {})
    if not isinstance(not_calibrated, dict) or not all(
        isinstance(v, str) for v in not_calibrated.values()
    ):
        raise _field_error(where, "not_calibrated", "an object of reasons", not_calibrated)
    return CalibrationTable(dict(about), samples, dict(not_calibrated))


def read_table(path: Path) -> CalibrationTable:
    """The calibration table at ``path``."""
    data = read_json_table(path, "parity calibration table", "nemotron-vl-calibrate")
    return parse_table(data, str(path))


@functools.cache
def committed_table() -> CalibrationTable:
    """The committed table (:data:`CALIBRATION_TABLE`), read once."""
    return read_table(CALIBRATION_TABLE)


def tower_shape(spec: ModelSpec) -> dict[str, object]:
    """``spec``'s tower shape: its :data:`SHAPE_FIELDS`."""
    return {name: getattr(spec, name) for name in SHAPE_FIELDS}


def with_tower_shape(spec: ModelSpec, shape: dict[str, object]) -> ModelSpec:
    """``spec`` with the tower ``shape`` (:func:`tower_shape`) in place of its own."""
    unknown = sorted(set(shape) - set(SHAPE_FIELDS))
    if unknown:
        raise ValueError(f"tower shape: expected fields of {list(SHAPE_FIELDS)}, got {unknown}")
    changes: dict[str, Any] = dict(shape)
    return dataclasses.replace(spec, **changes)


def shape_slug(shape: dict[str, object]) -> str:
    """A tower shape's file name: ``image32-projector64-mel16-hidden96-sound-other``."""
    return (
        f"image{shape['image_size']}-projector{shape['projector_hidden_size']}-"
        f"mel{shape['num_mel_bins']}-hidden{shape['hidden_size']}-sound-{shape['sound_sizes']}"
    )


@functools.cache
def _shape_table(slug: str) -> CalibrationTable | None:
    path = SHAPES_DIR / f"{slug}.json"
    return read_table(path) if path.is_file() else None


def table_for_shape(spec: ModelSpec) -> CalibrationTable:
    """The table whose samples were measured on ``spec``'s tower shape: the committed one for
    the default shape, the shape's own (:data:`SHAPES_DIR`) for another; else a table with no
    samples (the analytic ceiling), saying which shape no calibration measured."""
    shape = tower_shape(spec)
    if shape == tower_shape(ModelSpec()):
        return committed_table()
    table = _shape_table(shape_slug(shape))
    if table is not None:
        return table
    return uncalibrated_table(
        f"a tower shape no calibration measured ({shape_slug(shape)}: nemotron-vl-calibrate "
        "--shapes --write measures the covering array's)"
    )


def uncalibrated_table(why: str) -> CalibrationTable:
    """A table with no samples: every path's bound is the analytic ceiling, saying ``why``."""
    return CalibrationTable(about={}, samples={}, not_calibrated={}, uncalibrated=why)


def parity_bounds(path: str, served: torch.dtype, saved: str) -> CellBounds:
    """The committed table's bounds for ``path`` served in ``served``, saved in ``saved``."""
    return committed_table().bounds(path, served, saved)
