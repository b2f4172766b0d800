"""Every pair of options: the variants of an all-pairs covering array, each through the request
catalogue, against the reference.

The checkpoint's options (language model kind, tiling, audio tower, temporal patch, MTP layers,
Parakeet's hop, convolution biases and mel bins, tile side, fp8 weights, the dtype it is saved
in, the thumbnail, the pixel normalisation, ``mlp1``'s width, RADIO's registers and position
table, the language model's width and other sizes, Parakeet's sizes) and the engine's (EVS rate,
tile limit) are combined by :func:`harness.checkpoints.pairs.covering_array` so that any two
options' values meet in some variant (15 variants for 21 axes; the 4 with the Omni language
model or fp8 weights need CUDA; the fp32 checkpoint's are isolated too, see ``pairs.ISOLATED``).
Each variant is built once and serves every catalogued form it can
(:func:`~harness.inputs.catalogue.forms_for`): its prompt, placeholders and rows must be the
reference's on the same folder, rows within the bounds of each path in the dtype they come in
(:func:`harness.oracles.rows.compare_with_reference`, as ``test_parity``), calibrated on the
variant's own tower shape (:func:`harness.oracles.bounds.table_for_shape`: the default shape's
table, or the shape's own). The reference is the
oracle, so the check does not run on the reference target.
"""

from __future__ import annotations

import pytest

from harness.checkpoints.pairs import covering_array
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import RequestForm, forms_for
from harness.jobs.deviations import describe, explained_by
from harness.oracles.bounds import table_for_shape
from harness.oracles.rows import compare_with_reference
from harness.problems import assert_no_problems
from suites.conformance.test_parity import _same_prompt_and_positions

pytestmark = pytest.mark.concern("requests")

VARIANTS = {spec.slug: spec for spec in covering_array()}
#: What a form's entry in ``measured`` is when its rows were not measured (the report lists only
#: measured kinds).
NOTE = "pairwise-note"
#: One form per path an option changes: static tiles with a thumbnail, dynamic tiles, a request's
#: own tile limit, video at T = 1 and 2, EVS on scenes, audio clips and a video's track, every
#: modality in one request, and precomputed embeddings.
PAIRWISE_FORMS = (
    "images-pil",
    "images-dynamic",
    "image-fewer-tiles-per-request",
    "video-t1",
    "videos-t2",
    "video-evs-t1",
    "audios",
    "video-audio-in-video",
    "mixed",
    "image-embeds-list",
)


def rows_comparable(form: RequestForm, spec: ModelSpec) -> bool:
    """Whether ``form``'s rows on ``spec`` must be the reference's. Under EVS only a form whose
    videos were drawn for this rate and temporal patch (scenes, so that the cut never falls among
    near-equal scores) keeps the same tokens in bf16 as the fp32 reference; on other videos a
    near tie may keep another token, and only the prompt (whose token count the rate sets) is
    compared."""
    if spec.video_pruning_rate == 0.0 or form.request.embeddings("video") is not None:
        return True
    if not form.request.videos:
        return True
    designed = form.spec
    return (designed.video_pruning_rate, designed.video_temporal_patch_size) == (
        spec.video_pruning_rate,
        spec.video_temporal_patch_size,
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_of_the_covering_array_serves_the_catalogue_as_the_reference(
    target, device, reference_runs, pinned_deviations, variant, record_property
):
    spec = VARIANTS[variant]
    model = target.model(spec, device)
    table = table_for_shape(spec)
    problems: list[str] = []
    # Per form and item, flat: "images-pil image[0]" -> its parity numbers, as test_parity's.
    measured: dict[str, object] = {}
    for form in forms_for(spec, PAIRWISE_FORMS):
        expected = reference_runs.run(form.name, spec=spec)
        request = form.request_for(spec)
        try:
            actual = model.run_request(request)
            if not rows_comparable(form, spec):
                _same_prompt_and_positions(actual, expected)
                measured[form.name] = {
                    "kind": NOTE,
                    "rows": "not compared (EVS, videos not drawn for it)",
                }
                continue
            numbers, found = compare_with_reference(
                actual,
                expected,
                request,
                spec,
                served=model.input_dtype,
                table=table,
            )
        except Exception as e:  # one form's failure must not hide the others'
            known = explained_by(e, pinned_deviations, request, spec)
            if known is not None:
                measured[form.name] = {"kind": NOTE, "known deviation": known}
            else:
                problems.append(f"{form.name}: {describe(e)}")
            continue
        if found and (known := explained_by(found, pinned_deviations, request, spec)) is not None:
            measured[form.name] = {"kind": NOTE, "known deviation": known}
            continue
        measured |= {f"{form.name} {item}": n for item, n in numbers.items()}
        problems += [f"{form.name}: {p}" for p in found]
    record_property("measured", measured)
    assert_no_problems(problems, f"{len(problems)} problems: ")
