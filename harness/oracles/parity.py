"""What parity with the reference measures, and what makes it able to see a bug.

A parity check compares a target's tower rows with the reference's under a bound derived from the
path's measured error (:mod:`harness.oracles.bounds`), never above the analytic ceiling of the
dtype the target computes in (:func:`rounding_ceiling`): a bug shows only where it moves the rows
by more than the bound. Two consequences are checked here, on every target:

- *sensitivity*: two inputs that differ in content must give rows that differ by many times the
  bound (:data:`MIN_SENSITIVITY_RATIO`). A path whose output hardly depends on its input (weights
  swamped by biases, a front end rounding the signal away) passes parity whatever its front end
  does, so the suites must never rest on one;
- *features*: what the processor hands the towers (pixel values, log-mel features) is compared
  elementwise before any tower runs (:data:`FEATURE_BOUNDS`), so a front-end bug cannot hide in
  the towers' rounding.

The analytic ceilings, and where they come from:

- fp32 rows: :data:`FP32_BOUND` = 1e-4. fp32 keeps 24 significant bits (u = 2^-24 ~ 6e-8); the
  towers' few thousand roundings, of partially cancelling sign, stay below 1e-5 (measured 1e-6 to
  4e-6 between the reference and vLLM's layers in fp32).
- bf16 rows: :data:`BF16_BOUND` = 16u = 6.25 % with u = 2^-8, bf16's unit roundoff. Every op of
  a 12-block ViT and the connector rounds once; measured 0.4 to 1.5 % on the tiny folders.
- fp16 rows (``--dtype float16``): :data:`FP16_BOUND` = 16u = 0.78 % with u = 2^-11, fp16's unit
  roundoff, by the same argument (fp16 keeps 11 significant bits; the tiny folders' activations
  stay far inside its range).
"""

from __future__ import annotations

import torch

FP32_BOUND = 1e-4
BF16_BOUND = 16 * 2.0**-8
FP16_BOUND = 16 * 2.0**-11

#: How many parity bounds apart two different inputs' rows must be. At 1x, a bug that replaced a
#: path's input by another input would pass parity; at 4x such a bug moves the rows by four
#: bounds, and one that loses a quarter of the input's content still fails. A constant path
#: measures 0. (Measured on the tiny folders in bf16: 6.8x for Parakeet at hop 128, whose
#: outputs for two noises share much, to 20x for the connector; at most ~22x, the relative
#: difference of unrelated zero-mean rows being ~sqrt(2).)
MIN_SENSITIVITY_RATIO = 4.0


def rounding_ceiling(dtype: torch.dtype) -> float:
    """The most relative error rounding can explain in rows computed in ``dtype`` (16 unit
    roundoffs; 1e-4 in fp32): the ceiling of every derived bound, and the bound of comparisons
    with no calibration (a target against itself)."""
    return {torch.bfloat16: BF16_BOUND, torch.float16: FP16_BOUND}.get(dtype, FP32_BOUND)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` (Frobenius, in fp64)."""
    e = expected.double().cpu()
    return float((actual.double().cpu() - e).norm() / e.norm().clamp_min(1e-30))


def table_rows(rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: which of ``rows`` are, bit for bit, rows of the embedding ``table`` (a
    video's separator text, looked up rather than computed)."""
    return (rows.to(table.dtype)[:, None, :] == table[None, :, :]).all(-1).any(-1)


# ---------------------------------------------------------------------------------------------
# Features before the towers


#: Elementwise bounds ``|target - reference| <= atol + rtol * |reference|`` on the processor's
#: floating outputs, compared in fp32 (the engine's cast to the model's dtype comes after):
#:
#: - ``pixel_values_flat`` / ``pixel_values_flat_video``: ``(x / 255 - mean) / std`` of resized
#:   uint8 pixels, the resize bicubic with antialiasing in float. Two implementations of the
#:   same arithmetic agree to fp32 rounding (measured: vLLM's pixels equal the reference's up to
#:   their own bf16 rounding, at most 0.0078 where |x| ~ 2). atol 2e-3 is an eighth of one uint8
#:   level after normalisation (``1 / (255 * std) ~ 0.017``): a resize without antialiasing, a
#:   wrong mean or std, a swapped channel or a transposed tile moves pixels by levels.
#: - ``input_audio_features``: log-mel features normalised per clip and bin. The STFT, the power
#:   and the mel product run in fp32 in both; the normalisation divides by a bin's standard
#:   deviation over time, which amplifies fp32 rounding (u = 6e-8) by ``1/std`` of the log
#:   power: measured 2.2e-6 at most over the catalogue's audio. atol 1e-4 and rtol 1e-5 leave
#:   about 50x; a periodic instead of a symmetric window, another mel scale or filter norm, a
#:   biased variance or padding frames let into the statistics move features by far more.
#:
#: A processor that makes a feature in a narrower dtype itself (vLLM's image processor makes
#: pixel values in the checkpoint's dtype) gets that dtype's rounding on top
#: (:func:`feature_allowance`).
FEATURE_BOUNDS: dict[str, tuple[float, float]] = {
    "pixel_values_flat": (2e-3, 0.0),
    "pixel_values_flat_video": (2e-3, 0.0),
    "input_audio_features": (1e-4, 1e-5),
}
#: The processor's other per-item outputs that must be equal (masks).
EXACT_FEATURE_KEYS = ("feature_attention_mask",)
#: Unit roundoff of the dtypes a processor may make features in.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def feature_allowance(key: str, dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for feature ``key`` made in ``dtype``: :data:`FEATURE_BOUNDS` plus one
    rounding to ``dtype``."""
    atol, rtol = FEATURE_BOUNDS[key]
    return atol, rtol + UNIT_ROUNDOFF[dtype]


def feature_error(
    key: str, actual: torch.Tensor, expected: torch.Tensor
) -> tuple[float, float, tuple[int, ...]]:
    """``(|actual - expected|, its allowance, the element's index)`` at the element that comes
    closest to (or goes furthest over) its allowance, for one of :data:`FEATURE_BOUNDS`'s keys
    (shapes already equal)."""
    atol, rtol = feature_allowance(key, actual.dtype)
    a, e = actual.double().cpu(), expected.double().cpu()
    error = (a - e).abs()
    allowance = atol + rtol * e.abs()
    flat = int((error - allowance).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape))
    return float(error[index]), float(allowance[index]), index


def max_feature_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest elementwise ``|actual - expected|``."""
    return float((actual.double().cpu() - expected.double().cpu()).abs().max())
