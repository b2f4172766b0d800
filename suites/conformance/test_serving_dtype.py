"""``--dtype``: the model served in bfloat16, float16 and float32, from checkpoints saved in bf16
and in fp32, through the request catalogue, against the reference.

A user on a GPU without bf16 serves in float16; CPU and debugging runs serve in float32; a
checkpoint may be saved in either. Whatever the combination, the towers' rows come in the dtype
asked for (``auto``: the engine's choice, which vLLM documents: the saved dtype, an fp32
checkpoint in the platform's preferred half precision), the towers, the connector and the
embeddings run in it (the engine casts the processor's features to it), and the rows are the
reference's (fp32, on the same folder; the oracle of test_parity, so the check does not run on
the reference target) within the bounds of each path in that dtype
(:func:`harness.oracles.bounds.parity_bounds`: derived from the calibration where the calibrated
vLLM served the cell, else the analytic ceiling of 16 unit roundoffs, 2^-8 for bf16, 2^-11 for
fp16; 1e-4 for fp32). A video's separator rows are token embeddings, exact in the served dtype.

The forms cover every path a dtype changes: static and dynamic tiles, video at T = 1 and 2, EVS,
audio, and all of them in one request. The reference runs each form once per checkpoint dtype;
the target builds one model per checkpoint, dtype and variant.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.checkpoints.serving import DEFAULT_SERVING
from harness.checkpoints.serving import DTYPE_CASES as ALL_DTYPE_CASES
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.oracles.rows import compare_with_reference
from harness.problems import assert_no_problems

pytestmark = pytest.mark.concern("requests")

#: (the dtype the folder is saved in, ``--dtype``): every case but the default (bf16 served as
#: saved: every other check's configuration).
DTYPE_CASES = [case for case in ALL_DTYPE_CASES if case != ("bfloat16", DEFAULT_SERVING)]
#: One form per path a dtype changes (harness.inputs.catalogue.REQUEST_FORMS). Embeddings given in a
#: request pass no tower; their bit-exactness is test_parity's (in the default configuration).
FORMS = (
    "images-pil",
    "images-dynamic",
    "video-t1",
    "videos-t2",
    "video-evs-t1",
    "audios",
    "mixed",
)


def saved_as(spec: ModelSpec, saved: str) -> ModelSpec:
    return dataclasses.replace(spec, checkpoint_dtype=saved)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("saved", "serving"), DTYPE_CASES, ids=[f"saved-{s}-{c.dtype}" for s, c in DTYPE_CASES]
)
def test_served_dtype_matches_the_reference(
    target, device, reference_runs, saved, serving, form, record_property
):
    catalogued = FORMS_BY_NAME[form]
    spec = saved_as(catalogued.spec, saved)
    model = target.model(spec, device, serving)
    # The dtype asked for; with ``auto`` the engine's own choice (its documented resolution).
    served = serving.torch_dtype() or model.input_dtype
    actual = model.run_request(catalogued.request)
    expected = reference_runs.run(form, spec=spec)
    measured, problems = compare_with_reference(
        actual, expected, catalogued.request, spec, served=served
    )
    record_property("measured", measured)
    assert_no_problems(problems)
