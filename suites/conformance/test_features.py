"""Features before the towers: what the target's processor hands each tower, against the
reference's.

For every request form with media, each item's processor outputs (``pixel_values_flat``,
``pixel_values_flat_video``, ``input_audio_features`` and its ``feature_attention_mask``) are
compared with the reference processor's (:func:`harness.oracles.features.compare_features`: in
fp32 before the engine's cast to the model's dtype, elementwise within
:data:`harness.oracles.parity.FEATURE_BOUNDS`; masks exactly). A front-end bug
(window, mel filter bank, normalisation, padding mask, resize, pixel normalisation) shows here
before a tower's rounding can hide it. The largest error per item goes into the report.
"""

from __future__ import annotations

import pytest
import torch

from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.oracles.features import compare_features
from harness.problems import assert_no_problems

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
    from harness.oracles.cache import oracle_target

    return oracle_target(target.name)


@pytest.mark.parametrize("form", MEDIA_FORMS)
def test_features_match_the_reference(target, reference_target, device, form, record_property):
    spec, request = FORMS_BY_NAME[form].spec, FORMS_BY_NAME[form].request
    actual = target.model(spec, device).request_features(request)
    expected = reference_target.model(spec, torch.device("cpu")).request_features(request)
    measured, problems = compare_features(actual, expected)
    record_property("measured", measured)
    assert_no_problems(problems)
