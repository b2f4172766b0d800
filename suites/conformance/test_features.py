"""Features before the towers: what the target's processor hands each tower, against the
reference's.

For every request form with media, each item's processor outputs (``pixel_values_flat``,
``pixel_values_flat_video``, ``input_audio_features`` and its ``feature_attention_mask``) are
compared with the reference processor's in fp32 (before the engine's cast to the model's dtype;
a processor that makes a feature in a narrower dtype itself is allowed that rounding on top),
elementwise within :data:`harness.oracles.parity.FEATURE_BOUNDS`; masks exactly. A front-end bug
(window, mel filter bank, normalisation, padding mask, resize, pixel normalisation) shows here
before a tower's rounding can hide it. The largest error per item goes into the report.
"""

from __future__ import annotations

import pytest
import torch

from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.oracles.parity import (
    EXACT_FEATURE_KEYS,
    UNIT_ROUNDOFF,
    feature_allowance,
    feature_error,
    max_feature_error,
)

pytestmark = pytest.mark.concern("requests")

#: Forms that send media (pure-embedding forms give the towers nothing).
MEDIA_FORMS = [
    form.name
    for form in REQUEST_FORMS
    if any(
        form.request.num_items(m) and form.request.embeddings(m) is None
        for m in ("image", "video", "audio")
    )
]


@pytest.fixture(scope="module")
def reference_target(target):
    if target.name == "reference":
        pytest.skip("the reference is the oracle of the feature checks")
    from harness.targets.reference.target import ReferenceTarget

    return ReferenceTarget()


@pytest.mark.parametrize("form", MEDIA_FORMS)
def test_features_match_the_reference(target, reference_target, device, form, record_property):
    spec, request = FORMS_BY_NAME[form].spec, FORMS_BY_NAME[form].request
    actual = target.model(spec, device).request_features(request)
    expected = reference_target.model(spec, torch.device("cpu")).request_features(request)
    assert [(f.modality, f.index) for f in actual] == [(f.modality, f.index) for f in expected], (
        "items with features differ from the reference's"
    )
    measured: dict[str, object] = {}
    record_property("measured", measured)  # filled below: a failing check keeps what it saw
    for got, want in zip(actual, expected, strict=True):
        name = f"{got.modality}[{got.index}]"
        assert set(got.tensors) == set(want.tensors), (
            f"{name}: feature keys {sorted(got.tensors)}, the reference's {sorted(want.tensors)}"
        )
        for key, reference in want.tensors.items():
            tensor = got.tensors[key]
            assert tuple(tensor.shape) == tuple(reference.shape), (
                f"{name}: {key} shaped {tuple(tensor.shape)}, the reference's "
                f"{tuple(reference.shape)}"
            )
            if key in EXACT_FEATURE_KEYS:
                assert torch.equal(tensor.cpu(), reference), (
                    f"{name}: {key}: expected the reference's ({int(reference.sum())} of "
                    f"{reference.numel()} set), got {int(tensor.sum())} set, differing at "
                    f"{int((tensor.cpu() != reference).sum())} places"
                )
                continue
            assert tensor.dtype in UNIT_ROUNDOFF, (
                f"{name}: {key}: expected a floating dtype {sorted(map(str, UNIT_ROUNDOFF))}, "
                f"got {tensor.dtype}"
            )
            error, allowed, where = feature_error(key, tensor, reference)
            atol, rtol = feature_allowance(key, tensor.dtype)
            measured[f"{name} {key}"] = {
                "kind": "features",
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "max_abs_error": float(f"{max_feature_error(tensor, reference):.3g}"),
                "atol": atol,
                "rtol": float(f"{rtol:.3g}"),
            }
            assert error <= allowed, (
                f"{name}: {key}{list(where)} is {float(tensor[where]):.6g}, the reference's "
                f"{float(reference[where]):.6g}: error {error:.3g}, allowed {allowed:.3g}"
            )
