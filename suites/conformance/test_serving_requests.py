"""Serving options a request meets, as a user sets them on ``vllm serve``.

- ``--enable-mm-embeds`` off: a request with embeddings is refused with an error naming the
  option, before any tower runs; the same engine then serves media requests as the default
  configuration does.
- ``--limit-mm-per-prompt``: a request with more items of a modality than its limit (an audio
  track taken from a video counts as an audio item) is refused with an error naming the limit,
  before any tower runs; a request at the limit is served.
- ``--max-model-len``: a prompt longer than the context is refused with an error naming the
  option, before any tower runs.
- ``--media-io-kwargs '{"video": {"num_frames": N}}'``: a video file is loaded with N frames
  spread over the clip, and its placeholders follow: N frames of one tile's rows each
  (``(tile / patch)^2 / 4``, the pixel shuffle's 2 x 2).
- ``--mm-processor-kwargs``: ``max_num_tiles`` caps each image's static tiles (the count from
  the reference's tiling arithmetic); an option the processor does not take is refused naming
  it, or followed.

"Before any tower runs": the towers' recorded calls are empty after the refusal. Where a check
compares a configuration with the target's own default configuration, it says so (a
self-consistency check: the option must change nothing else).
"""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.media import video_file
from harness.inputs.requests import Request
from harness.oracles.assertions import assert_refusal, refused_naming
from harness.oracles.cache import oracle_target
from reference_impl.tiling import num_static_tiles
from reference_impl.tokenizer import IMG_CONTEXT, shared_tokenizer

pytestmark = pytest.mark.concern("requests")

EMBEDS_OFF = ServingConfig(enable_mm_embeds=False)


def assert_no_tower_ran(model) -> None:
    ran = {"vision": model.calls.vision, "audio": model.calls.audio}
    assert ran == {"vision": [], "audio": []}, f"the towers ran before the refusal: {ran}"


def assert_same_result(actual, expected, what: str) -> None:
    assert actual.prompt_token_ids == expected.prompt_token_ids, f"{what}: the prompt changed"
    assert actual.items == expected.items, f"{what}: the placeholders changed"
    for got, want in zip(actual.embeddings, expected.embeddings, strict=True):
        assert torch.equal(got, want), f"{what}: the embeddings changed"


# --- --enable-mm-embeds ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["image-embeds-list", "video-embeds-list"])
@pytest.mark.parametrize("serving", [EMBEDS_OFF], ids=["embeds-off"])
def test_embeddings_without_the_option_are_refused_naming_it(target, device, serving, form):
    catalogued = FORMS_BY_NAME[form]
    model = target.model(catalogued.spec, device, serving)
    with refused_naming("enable-mm-embeds", "enable_mm_embeds"):
        model.run_request(catalogued.request)
    assert_no_tower_ran(model)


@pytest.mark.self_consistency("the target served with the default configuration")
@pytest.mark.parametrize("form", ["images-pil", "mixed"])
@pytest.mark.parametrize("serving", [EMBEDS_OFF], ids=["embeds-off"])
def test_media_are_served_as_by_default_with_embeddings_off(target, device, serving, form):
    catalogued = FORMS_BY_NAME[form]
    model = target.model(catalogued.spec, device, serving)
    refused = FORMS_BY_NAME["image-embeds-list"].request
    with pytest.raises(Exception):  # noqa: B017, PT011 - the refusal's form is the check above
        model.run_request(refused)
    served = model.run_request(catalogued.request)
    default = target.model(catalogued.spec, device).run_request(catalogued.request)
    assert_same_result(served, default, "--enable-mm-embeds off, after a refused request")


# --- --limit-mm-per-prompt ---------------------------------------------------------------------

#: (form, modality): requests with two or more items of the modality, or (audio) tracks.
LIMITED = [
    ("images-pil", "image"),
    ("videos-t2", "video"),
    ("audios", "audio"),
    ("video-audio-in-video", "audio"),
]


def limit_names(modality: str, limit: int) -> tuple[str, ...]:
    """What a refusal may name: the option, or the limit it states (vLLM's 'At most 1
    image(s)')."""
    return ("limit-mm-per-prompt", "limit_mm_per_prompt", f"{limit} {modality}")


@pytest.mark.parametrize(("form", "modality"), LIMITED, ids=[f"{f}-{m}" for f, m in LIMITED])
def test_items_over_the_limit_are_refused_before_the_towers(
    target, device, form, modality, record_property
):
    catalogued = FORMS_BY_NAME[form]
    count = catalogued.request.expected_items(modality)
    assert count >= 1, f"{form} has no {modality} item"
    serving = ServingConfig(limit_mm_per_prompt={modality: count - 1})
    record_property("serving", serving)
    model = target.model(catalogued.spec, device, serving)
    with refused_naming(*limit_names(modality, count - 1)):
        model.run_request(catalogued.request)
    assert_no_tower_ran(model)


@pytest.mark.self_consistency("the target served with the default configuration")
@pytest.mark.parametrize(("form", "modality"), LIMITED, ids=[f"{f}-{m}" for f, m in LIMITED])
def test_items_at_the_limit_are_served(target, device, form, modality, record_property):
    catalogued = FORMS_BY_NAME[form]
    count = catalogued.request.expected_items(modality)
    serving = ServingConfig(limit_mm_per_prompt={modality: count})
    record_property("serving", serving)
    served = target.model(catalogued.spec, device, serving).run_request(catalogued.request)
    default = target.model(catalogued.spec, device).run_request(catalogued.request)
    assert_same_result(served, default, f"--limit-mm-per-prompt {modality}={count}")


# --- --max-model-len ---------------------------------------------------------------------------

CONTEXT_FORMS = ["images-pil", "video-t1", "audios", "mixed"]


@pytest.mark.parametrize("form", CONTEXT_FORMS)
def test_a_prompt_longer_than_the_context_is_refused_before_the_towers(
    target, device, form, record_property
):
    catalogued = FORMS_BY_NAME[form]
    length = len(
        target.model(catalogued.spec, device).process_request(catalogued.request).prompt_token_ids
    )
    serving = ServingConfig(max_model_len=length - 1)
    record_property("serving", serving)
    model = target.model(catalogued.spec, device, serving)
    with refused_naming("max_model_len", "max-model-len"):
        model.run_request(catalogued.request)
    assert_no_tower_ran(model)


# --- --media-io-kwargs -------------------------------------------------------------------------


#: A 10-frame video file at 2 fps, no audio track.
def ten_frames() -> Request:
    return Request("Watch <video>.", videos=[video_file(10, 64, 64, 31, audio_seconds=None)])


@pytest.mark.parametrize("num_frames", [2, 4])
def test_video_files_are_loaded_with_the_frames_asked_for(
    target, device, num_frames, record_property
):
    spec = ModelSpec()
    serving = ServingConfig(media_io_kwargs={"video": {"num_frames": num_frames}})
    record_property("serving", serving)
    request = ten_frames()
    result = target.model(spec, device, serving).run_request(request)
    rows_per_frame = (spec.image_size // spec.patch_size) ** 2 // 4
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    (item,) = result.items
    context_rows = sum(result.prompt_token_ids[p] == context for p in item.positions)
    assert context_rows == num_frames * rows_per_frame, (
        f"--media-io-kwargs num_frames={num_frames}: {context_rows} video context rows, expected "
        f"{num_frames} frames x {rows_per_frame}"
    )
    if target.name != "reference":  # the reference, loading with the same option, is the oracle
        expected = oracle_target(target.name).model(spec, torch.device("cpu"), serving)
        assert result.prompt_token_ids == expected.process_request(request).prompt_token_ids, (
            "the prompt (frame separators and timestamps) differs from the reference's"
        )


# --- --mm-processor-kwargs ---------------------------------------------------------------------


@pytest.mark.parametrize("max_num_tiles", [1, 2])
def test_the_tile_limit_follows_the_processor_options(
    target, device, max_num_tiles, record_property
):
    catalogued = FORMS_BY_NAME["images-pil"]
    spec = catalogued.spec
    serving = ServingConfig(mm_processor_kwargs={"max_num_tiles": max_num_tiles})
    record_property("serving", serving)
    result = target.model(spec, device, serving).run_request(catalogued.request)
    config = spec.vl_config()
    expected = [
        num_static_tiles(*image.size, spec.image_size, max_num_tiles, config.use_thumbnail)
        * spec.tokens_per_tile
        for image in catalogued.request.images
    ]
    assert [e.shape[0] for e in result.embeddings] == expected, (
        f"--mm-processor-kwargs max_num_tiles={max_num_tiles}: rows per image"
    )


def test_a_dynamic_patch_limit_is_followed_or_refused_naming_it(target, device, record_property):
    catalogued = FORMS_BY_NAME["images-dynamic"]
    serving = ServingConfig(mm_processor_kwargs={"max_num_patches": 16})
    record_property("serving", serving)
    try:
        result = target.model(catalogued.spec, device, serving).run_request(catalogued.request)
    except Exception as exc:  # refused: it must name the option it does not take
        assert_refusal(exc, ["max_num_patches"])
        return
    for item, rows in zip(result.items, result.embeddings, strict=True):
        assert rows.shape[0] <= 16 // 4, (
            f"--mm-processor-kwargs max_num_patches=16: {item.modality}[{item.index}] has "
            f"{rows.shape[0]} rows, more than 16 patches give"
        )
