"""Pairs, not points: the checkpoint variants of an all-pairs covering array over the options.

Each hand-picked variant changes one option from the default, so a bug that needs two options
together (dynamic tiles with ``T = 2``, an fp32 checkpoint with audio, MTP with fewer tiles) is
in no variant. :data:`AXES` lists every option of :class:`~harness.checkpoints.spec.ModelSpec` a
user's checkpoint or engine varies, with the default first and the other value the suites know
how to build; :func:`covering_array` combines them so that every pair of values of any two axes
is in some variant (covertable's greedy construction under a declared constraint, deterministic
for the same axes; allpairspy's filter left five pairs out), where the pair is allowed
(:func:`allowed`). Its size is bounded by :data:`MAX_VARIANTS`: 21 binary axes need at least 4
variants, and one variant per pair of axis values would be 840.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

from harness.checkpoints.spec import ModelSpec

#: Each option and its values, the default first: the checkpoint's (language model kind, tiling,
#: audio tower, temporal patch, MTP layers, Parakeet's hop, tile side, the Omni form of Parakeet's
#: convolutions, fp8 weights, the dtype it is saved in, the thumbnail tile, the pixel
#: normalisation, ``mlp1``'s width, Parakeet's mel bins, RADIO's registers and position-embedding
#: table, the language model's width, its other sizes, and Parakeet's sizes) and the engine's (EVS
#: rate, tile limit). The last nine are fields the config-field inventory found read with no
#: variant setting them (``text_sizes`` and ``sound_sizes`` change every size and bias switch
#: the towers' vLLM code reads at once: spec.OTHER_TEXT_SIZES, spec.OTHER_SOUND_SIZES).
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
    "use_thumbnail": (True, False),
    "pixel_normalisation": ("clip", "half"),
    "projector_hidden_size": (64, 32),
    "num_mel_bins": (16, 32),
    "register_multiple": (8, None),
    "cpe_max_size": (256, 512),
    "hidden_size": (64, 96),
    "text_sizes": ("default", "other"),
    "sound_sizes": ("default", "other"),
}
#: The most variants the covering array may have (each is built once per target).
MAX_VARIANTS = 16


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


#: Values kept out of the main array, each with why: a variant holding one serves the request
#: catalogue on no CPU (vLLM builds the Omni language model's MoE layers only on CUDA, and fp8
#: weights need its compiled ops after loading), or fails every tower request the same known way
#: (vLLM 0.33.0 serves an fp32 checkpoint in bf16 but builds its towers in fp32: the pinned
#: serving-dtype deviation), so that mixed into the main array it would hide the pairs it holds.
ISOLATED: dict[str, tuple[object, str]] = {
    "language_model": ("omni", "needs CUDA: vLLM's CPU constructor refuses non-gated MoE"),
    "quantization": ("fp8", "needs CUDA: vLLM's fp8 post-load step needs vllm._C"),
    "checkpoint_dtype": ("float32", "every tower request fails the pinned serving-dtype way"),
}


def isolated(spec: ModelSpec) -> bool:
    """Whether ``spec`` holds a value of :data:`ISOLATED`."""
    return any(getattr(spec, axis) == value for axis, (value, _) in ISOLATED.items())


@functools.cache
def covering_array() -> tuple[ModelSpec, ...]:
    """The variants: every allowed pair of values of any two axes in at least one.

    The pairs among the values not :data:`ISOLATED` come from covertable's array over those
    values alone, so that they meet where each is exercised. Each isolated value then gets two
    variants: with every other axis at its default, and with every other axis changed where
    allowed; with binary axes, that pairs it with every value of every other axis."""
    from covertable import make

    main = {
        axis: [v for v in values if ISOLATED.get(axis, (object(), ""))[0] != v]
        for axis, values in AXES.items()
    }
    rows: list[dict[str, object]] = list(make(main, constraints=CONSTRAINTS))
    for axis, (value, _) in ISOLATED.items():
        rows.append({axis: value})
        # Every other axis changed, isolated values included, as far as allowed.
        changed = {axis: value}
        for other, values in AXES.items():
            if other != axis:
                changed[other] = values[-1]
                if not allowed([changed.get(a, AXES[a][0]) for a in AXES]):
                    changed[other] = values[0]
        rows.append(changed)
    # covertable's rows are plain dicts of the AXES' values; ModelSpec validates each.
    specs = [ModelSpec(**row) for row in rows]  # type: ignore[arg-type]
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
