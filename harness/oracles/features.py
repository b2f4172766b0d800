"""What a processor hands each tower, against the reference's: one comparison for every check.

Each item's processor outputs (``pixel_values_flat``, ``pixel_values_flat_video``,
``input_audio_features`` and its ``feature_attention_mask``) are compared with the reference
processor's in fp32 (before the engine's cast to the model's dtype; a processor that makes a
feature in a narrower dtype itself is allowed that rounding on top), elementwise within
:data:`harness.oracles.parity.FEATURE_BOUNDS`; masks exactly. A front-end bug (window, mel
filter bank, normalisation, padding mask, resize, resampling) shows here before a tower's
rounding can hide it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.inputs.requests import ItemFeatures
from harness.oracles.parity import (
    EXACT_FEATURE_KEYS,
    UNIT_ROUNDOFF,
    feature_allowance,
    feature_error,
    max_feature_error,
)


def compare_features(
    actual: Sequence[ItemFeatures], expected: Sequence[ItemFeatures]
) -> tuple[dict[str, object], list[str]]:
    """The largest error of each item's each feature (``"image[0] pixel_values_flat"`` -> its
    numbers), and every way ``actual`` departs from the reference's ``expected``: other items,
    other keys or shapes, a mask not equal, a floating feature past its allowance."""
    if [(f.modality, f.index) for f in actual] != [(f.modality, f.index) for f in expected]:
        return {}, ["items with features differ from the reference's"]
    measured: dict[str, object] = {}
    problems: list[str] = []
    for got, want in zip(actual, expected, strict=True):
        name = f"{got.modality}[{got.index}]"
        if set(got.tensors) != set(want.tensors):
            keys, reference_keys = sorted(got.tensors), sorted(want.tensors)
            problems.append(f"{name}: feature keys {keys}, the reference's {reference_keys}")
            continue
        for key, reference in want.tensors.items():
            problems += _compare_one(name, key, got.tensors[key], reference, measured)
    return measured, problems


def _compare_one(
    name: str,
    key: str,
    tensor: torch.Tensor,
    reference: torch.Tensor,
    measured: dict[str, object],
) -> list[str]:
    if tuple(tensor.shape) != tuple(reference.shape):
        return [
            f"{name}: {key} shaped {tuple(tensor.shape)}, the reference's {tuple(reference.shape)}"
        ]
    if key in EXACT_FEATURE_KEYS:
        if torch.equal(tensor.cpu(), reference):
            return []
        return [
            f"{name}: {key}: expected the reference's ({int(reference.sum())} of "
            f"{reference.numel()} set), got {int(tensor.sum())} set, differing at "
            f"{int((tensor.cpu() != reference).sum())} places"
        ]
    if tensor.dtype not in UNIT_ROUNDOFF:
        return [
            f"{name}: {key}: expected a floating dtype {sorted(map(str, UNIT_ROUNDOFF))}, "
            f"got {tensor.dtype}"
        ]
    error, allowed, where = feature_error(key, tensor, reference)
    atol, rtol = feature_allowance(key, tensor.dtype)
    measured[f"{name} {key}"] = {
        "kind": "features",
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "max_abs_error": float(f"{max_feature_error(tensor, reference):.3g}"),
        "atol": atol,
        "rtol": float(f"{rtol:.3g}"),
    }
    if error <= allowed:
        return []
    return [
        f"{name}: {key}{list(where)} is {float(tensor[where]):.6g}, the reference's "
        f"{float(reference[where]):.6g}: error {error:.3g}, allowed {allowed:.3g}"
    ]
