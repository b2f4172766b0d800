"""Pairs, not points: the checkpoint variants of an all-pairs covering array over the options.

Each hand-picked variant changes one option from the default, so a bug that needs two options
together (dynamic tiles with ``T = 2``, an fp32 checkpoint with audio, MTP with fewer tiles) is
in no variant. :data:`AXES` lists every option of :class:`~harness.checkpoints.spec.ModelSpec` a
user's checkpoint or engine varies, with the default first and the other value the suites know
how to build; :func:`covering_array` combines them so that every pair of values of any two axes
is in some variant (covertable's greedy construction under a declared constraint, deterministic
for the same axes; allpairspy's filter left five pairs out), where the pair is allowed
(:func:`allowed`). Its size is bounded by :data:`MAX_VARIANTS`: 12 binary axes need at least 4
variants, and one variant per pair of axis values would be 264.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

from harness.checkpoints.spec import ModelSpec

#: Each option and its values, the default first: the checkpoint's (language model kind, tiling,
#: audio tower, temporal patch, MTP layers, Parakeet's hop, tile side, the Omni form of Parakeet's
#: convolutions, fp8 weights, the dtype it is saved in) and the engine's (EVS rate, tile limit).
AXES: dict[str, tuple[object, ...]] = {
    "language_model": ("v2", "omni"),
    "dynamic_resolution": (False, True),
    "audio": (True, False),
    "video_temporal_patch_size": (1, 2),
    "mtp": (False, True),
    "audio_hop_length": (160, 128),
    "image_size": (64, 32),
    "audio_convolution_bias": (True, False),
    "quantization": ("none", "fp8"),
    "checkpoint_dtype": ("bfloat16", "float32"),
    "video_pruning_rate": (0.0, 0.5),
    "max_num_tiles": (12, 2),
}
#: The most variants the covering array may have (each is built once per target).
MAX_VARIANTS = 12


def allowed(values: Sequence[object]) -> bool:
    """Whether a (partial) row of values, in :data:`AXES` order, can be built: fp8 weights are
    written for the V2 language model only (no MoE experts)."""
    row = dict(zip(AXES, values, strict=False))
    return not (row.get("quantization") == "fp8" and row.get("language_model") == "omni")


#: :func:`allowed` as covertable's declarative constraint.
CONSTRAINTS = [
    {
        "operator": "not",
        "condition": {
            "operator": "and",
            "conditions": [
                {"operator": "eq", "left": "quantization", "value": "fp8"},
                {"operator": "eq", "left": "language_model", "value": "omni"},
            ],
        },
    }
]


#: Values vLLM builds only on CUDA (measured on the CPU target): NemotronH's MoE layers (the Omni
#: language model) refuse a CPU constructor, and fp8 weights need vLLM's compiled ops after loading.
CUDA_ONLY: dict[str, object] = {"language_model": "omni", "quantization": "fp8"}


@functools.cache
def covering_array() -> tuple[ModelSpec, ...]:
    """The variants: every allowed pair of values of any two axes in at least one.

    The pairs among the values a CPU builds come from covertable's array over those values
    alone, so that a CPU run (which skips what needs CUDA) still covers every pair of them. Each
    value of :data:`CUDA_ONLY` then gets two variants: with every other axis at its default, and
    with every other axis changed where allowed; with binary axes, that pairs it with every value
    of every other axis."""
    from covertable import make

    on_cpu = {
        axis: [v for v in values if CUDA_ONLY.get(axis, object()) != v]
        for axis, values in AXES.items()
    }
    rows: list[dict[str, object]] = list(make(on_cpu, constraints=CONSTRAINTS))
    for axis, value in CUDA_ONLY.items():
        rows.append({axis: value})
        changed = {other: values[-1] for other, values in on_cpu.items() if other != axis}
        changed[axis] = value
        rows.append(changed)
    specs = [dataclasses.replace(ModelSpec(), **row) for row in rows]  # type: ignore[arg-type]
    return tuple(dict.fromkeys(specs))


def uncovered_pairs(
    specs: Sequence[ModelSpec],
) -> list[tuple[tuple[str, object], tuple[str, object]]]:
    """Every allowed pair of axis values that no spec of ``specs`` holds (by brute force, not
    by the library that built the array)."""
    missing = []
    for (a, values_a), (b, values_b) in itertools.combinations(AXES.items(), 2):
        for x, y in itertools.product(values_a, values_b):
            partial = [x if axis == a else y if axis == b else AXES[axis][0] for axis in AXES]
            if not allowed(partial):
                continue
            if not any(getattr(s, a) == x and getattr(s, b) == y for s in specs):
                missing.append(((a, x), (b, y)))
    return missing


def changed_options(spec: ModelSpec) -> dict[str, object]:
    """The axes on which ``spec`` differs from the default."""
    default = ModelSpec()
    return {
        axis: getattr(spec, axis) for axis in AXES if getattr(spec, axis) != getattr(default, axis)
    }


def variant_id(spec: ModelSpec) -> str:
    """A short name for a variant of the array: the options it changes."""
    changed = changed_options(spec)
    return "+".join(f"{k}={v}" for k, v in changed.items()) or "default"
