"""Requests through the target's engine: processor, batching, the real model.

A request (:mod:`harness.inputs.requests`) is what a user sends: prompt text and media or
precomputed embeddings. The target runs it as its engine does (vLLM: the registry's processor and
data parser, its processor cache, the msgpack boundary, ``group_and_batch_mm_kwargs``,
``embed_multimodal``).
What every form must satisfy, whatever the implementation:

- every item of the request comes back once, in prompt order, and its embedding has exactly as
  many rows as the prompt positions its placeholder expanded to (the engine scatters row ``i``
  into position ``i``), ``h`` wide; image and audio rows fill the context token's positions;
- embeddings given in the request come back bit-exact, in their items and order;
- merged into the prompt (the engine's placeholder mask), each item's rows land at its positions
  and every other position keeps its token's embedding;
- processing through the engine's processor cache gives the same prompt and embeddings;
- every batch the model receives carries one form of its modality, the helper keys that form
  needs, and no None values (so the direct-call checks of those inputs are not reachable from a
  request: see ``reach`` in the deviation files);
- items of one request embed as they do alone, whatever the batching (within the rounding of
  their dtype);
- 32 threads sending requests through one shared processor and tokenizer (the engine's renderer
  shares one across its thread pool) get the single-threaded results.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from harness.checkpoints.cache import checkpoint_weights
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.media import audio_clip, embedding_rows, pil_image, video_clip
from harness.inputs.requests import PLACEHOLDER, Request
from harness.oracles.assertions import raises_clear_error
from harness.oracles.parity import relative_error, rounding_ceiling
from harness.oracles.rows import EMBEDDING_TABLE
from reference_impl.tokenizer import IMG_CONTEXT, build_tokenizer, shared_tokenizer
from suites.stress import THREADS, run_in_threads

pytestmark = pytest.mark.concern("requests")

FORMS = [form.name for form in REQUEST_FORMS]
#: Forms with several media items: each must embed as it does alone.
SEVERAL_MEDIA = [
    f.name
    for f in REQUEST_FORMS
    if "embeds" not in f.name
    and not f.request.audio_in_video  # its audio items are its videos' tracks, not sent alone
    and sum(f.request.num_items(m) for m in ("image", "video", "audio")) > 1
]
MODALITIES = ("image", "video", "audio")
#: The keys each form's batch must carry besides its routing key (the model cannot embed it
#: without them).
HELPER_KEYS = {
    "pixel_values_flat": {"image_num_patches", "imgs_sizes"},  # one of them: static or dynamic
    "pixel_values_flat_video": {"video_num_patches", "frames_indices", "frame_duration_ms"},
    "input_audio_features": {"feature_attention_mask", "audio_num_clips"},
}
ROUTING_KEYS = {
    "image": ("pixel_values_flat", "image_embeds"),
    "video": ("pixel_values_flat_video", "video_embeds"),
    "audio": ("input_audio_features",),
}


def context_token(modality: str) -> int | None:
    """The token every embedding row of an image or audio item replaces (from the tokenizer the
    checkpoint folder ships); videos interleave separator text, so None."""
    if modality == "video":
        return None
    text = PLACEHOLDER[modality]
    ids = shared_tokenizer().encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text} is not one token"
    return int(ids[0])


def _items_and_rows_agree(request: Request, result, hidden_size: int) -> None:
    for modality in MODALITIES:
        got = sorted(i.index for i in result.items if i.modality == modality)
        expected = list(range(request.expected_items(modality)))
        assert got == expected, f"{modality} items: expected {expected}, got {got}"
    assert len(result.embeddings) == len(result.items)
    taken: set[int] = set()
    previous = -1
    for item, embedding in zip(result.items, result.embeddings, strict=True):
        name = f"{item.modality}[{item.index}]"
        assert item.positions, f"{name}: no placeholder positions"
        assert item.positions[0] > previous, f"{name}: items out of prompt order"
        previous = item.positions[-1]
        assert not taken & set(item.positions), f"{name}: positions overlap another item's"
        taken |= set(item.positions)
        assert max(item.positions) < len(result.prompt_token_ids), f"{name}: past the prompt"
        assert tuple(embedding.shape) == (len(item.positions), hidden_size), (
            f"{name}: embedding {tuple(embedding.shape)} for {len(item.positions)} placeholder "
            f"positions (hidden size {hidden_size})"
        )
        token = context_token(item.modality)
        if token is not None:
            filled = {result.prompt_token_ids[p] for p in item.positions}
            assert filled == {token}, f"{name}: rows fill tokens {sorted(filled)}, not {token}"


def _batches_are_well_formed(result) -> None:
    for batch in result.batches:
        assert not batch.none_keys, f"{batch.modality} batch: None values for {batch.none_keys}"
        routing = [k for k in ROUTING_KEYS[batch.modality] if k in batch.keys]
        assert len(routing) == 1, f"{batch.modality} batch carries forms {routing}"
        helpers = HELPER_KEYS.get(routing[0], set())
        if routing[0] == "pixel_values_flat":
            assert helpers & set(batch.keys), f"image batch without {sorted(helpers)}"
        else:
            missing = helpers - set(batch.keys)
            assert not missing, f"{routing[0]} batch without {sorted(missing)}"


@pytest.mark.parametrize("form", FORMS)
def test_request_is_processed_and_embedded(request_runs, form):
    request = FORMS_BY_NAME[form].request
    result = request_runs.run(form)
    _items_and_rows_agree(request, result, FORMS_BY_NAME[form].spec.hidden_size)
    _batches_are_well_formed(result)
    for modality in MODALITIES:
        given = request.embeddings(modality)
        if given is None:
            continue
        for index, expected in enumerate(given):
            _, embedding = result.item(modality, index)
            assert embedding.dtype == expected.dtype, (
                f"{modality}[{index}]: dtype {embedding.dtype}, given {expected.dtype}"
            )
            assert torch.equal(embedding, expected), f"{modality}[{index}]: not the given rows"
    for _ in range(2):  # the second run is served from the cache
        cached = request_runs.model(form).run_request(request, cached=True)
        assert cached.prompt_token_ids == result.prompt_token_ids, "cached prompt differs"
        assert cached.items == result.items, "cached placeholders differ"
        for a, b in zip(cached.embeddings, result.embeddings, strict=True):
            assert torch.equal(a, b), "cached processing embeds differently"


@pytest.mark.parametrize("form", FORMS)
def test_embeddings_are_merged_at_their_placeholders(request_runs, form):
    """The prompt's input embeddings: each item's rows, in order, at the positions its
    placeholder expanded to (the processor's mask, never a search of the prompt for a token id:
    vLLM PR #16229; a video's rows fill its frame separators and ``<img>``/``</img>`` too, an
    audio clip's rows its own context token); every other position the checkpoint's embedding
    row of its token."""
    spec = FORMS_BY_NAME[form].spec
    result = request_runs.run(form)
    ids = result.prompt_token_ids
    mask = [False] * len(ids)
    for item in result.items:
        for position in item.positions:
            mask[position] = True
    merged = request_runs.model(form).embed_prompt(ids, result.embeddings, mask)
    assert tuple(merged.shape) == (len(ids), spec.hidden_size), f"shape {tuple(merged.shape)}"
    for item, embedding in zip(result.items, result.embeddings, strict=True):
        expected = embedding.to(merged.dtype)
        for row, position in enumerate(item.positions):
            assert torch.equal(merged[position], expected[row]), (
                f"{item.modality}[{item.index}]: position {position} does not hold its row {row}"
            )
    table = checkpoint_weights(spec)[EMBEDDING_TABLE]
    for position, token in enumerate(ids):
        if not mask[position]:
            assert torch.equal(merged[position], table[token].to(merged.dtype)), (
                f"text position {position} (token {token}) does not hold its token's embedding"
            )


@pytest.mark.self_consistency("each item in a request against the same item in a request alone")
@pytest.mark.parametrize("form", SEVERAL_MEDIA)
def test_items_embed_as_they_do_alone(request_runs, form):
    """Batching and mixing must not change an item's embedding: each item of the request, sent
    alone in a request of its own, embeds to the same rows, within the rounding its dtype allows
    (:func:`harness.oracles.parity.rounding_ceiling`: a batch of another shape may take other
    kernels, which round differently in bf16; an item mixed with another's rows, or cut at the
    wrong place, moves by its own size). A target against itself: no calibrated bound applies."""
    request = FORMS_BY_NAME[form].request
    result = request_runs.run(form)
    model = request_runs.model(form)
    for item, embedding in zip(result.items, result.embeddings, strict=True):
        modality = item.modality
        alone = Request(
            PLACEHOLDER[modality],
            **{modality + "s": [request.items(modality)[item.index]]},
        )
        single = model.run_request(alone)
        assert len(single.embeddings) == 1
        name = f"{item.modality}[{item.index}]"
        assert embedding.shape == single.embeddings[0].shape, (
            f"{name}: {tuple(embedding.shape)} in the request, "
            f"{tuple(single.embeddings[0].shape)} alone"
        )
        error, bound = (
            relative_error(embedding, single.embeddings[0]),
            rounding_ceiling(embedding.dtype),
        )
        assert error <= bound, (
            f"{name} embeds differently in the request: relative error {error:.3g} against "
            f"the item alone, bound {bound:.3g} for {embedding.dtype}"
        )


@pytest.mark.parametrize("modality", ["image", "video"])
def test_embeddings_of_the_wrong_width_are_rejected(make_model, modality):
    """Embeddings that cannot be merged into the prompt must be refused where the request enters,
    naming them."""
    model = make_model()
    wide = embedding_rows(3, model.spec.hidden_size + 1, 0)
    request = Request(PLACEHOLDER[modality], **{modality + "s": [wide]})
    with raises_clear_error(f"{modality}_embeds", f"{modality.capitalize()} embedding"):
        model.run_request(request)


def test_media_and_embeddings_of_one_modality_are_rejected(make_model):
    """One image given as pixels and one as embeddings: a request must be refused with a clear
    error naming the images, not processed in part."""
    model = make_model()
    request = Request(
        "<image> <image>",
        images=[embedding_rows(3, model.spec.hidden_size, 0), pil_image(32, 32, 1)],
    )
    with raises_clear_error("image"):
        model.run_request(request)


def test_a_very_thin_image_is_processed(make_model):
    """A 1470 x 5 image (a banner) on a dynamic-resolution checkpoint: it must become at least one
    patch each way and embed like any image."""
    model = make_model(dynamic_resolution=True)
    request = Request("<image>", images=[pil_image(5, 1470, 2)])
    result = model.run_request(request)
    _items_and_rows_agree(request, result, model.spec.hidden_size)


@pytest.mark.self_consistency("each video in the request against the same video alone")
def test_videos_of_two_aspect_ratios_embed_as_they_do_alone(make_model):
    """A checkpoint that resizes video frames to about 36 patches keeping their aspect ratio
    (``video_target_num_patches``, ``video_maintain_aspect_ratio``), sent a portrait and a
    landscape video in one request. Each side is the square root of 36 times the aspect (or over
    it) rounded, then made even: 96 x 48 px gives 8 x 4 patches (even already, 32 <= 36), 48 x 64
    px gives 5 x 7, whose rounding up (6 x 8 = 48) exceeds 36, so down: 4 x 6. After the 2 x 2
    shuffle, 8 and 6 tokens per frame: 3 x 8 + 2 x 6 = 36 frame tokens. Each video embeds as it
    does alone."""
    model = make_model(video_target_num_patches=36, video_maintain_aspect_ratio=True)
    tall, wide = video_clip(3, 96, 48, 50), video_clip(2, 48, 64, 51)
    request = Request("First <video>, then <video>.", videos=[tall, wide])
    result = model.run_request(request)
    _items_and_rows_agree(request, result, model.spec.hidden_size)
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    frame_tokens = result.prompt_token_ids.count(context)
    assert frame_tokens == 36, f"{frame_tokens} frame tokens, expected 3 x 8 + 2 x 6 = 36"
    for index, video in enumerate((tall, wide)):
        single = model.run_request(Request("<video>", videos=[video]))
        _, embedding = result.item("video", index)
        alone = single.embeddings[0]
        assert embedding.shape == alone.shape, (
            f"video[{index}]: {tuple(embedding.shape)} in the request, {tuple(alone.shape)} alone"
        )
        error, bound = relative_error(embedding, alone), rounding_ceiling(embedding.dtype)
        assert error <= bound, (
            f"video[{index}] embeds differently in the request: relative error {error:.3g} "
            f"against the video alone, bound {bound:.3g} for {embedding.dtype}"
        )


@pytest.mark.self_consistency("requests under 32 threads against the same requests one at a time")
def test_requests_through_one_processor_under_32_threads(request_runs):
    model = request_runs.model("mixed")
    forms = ("images-pil", "audios", "video-t1", "mixed")  # one checkpoint: one processor
    work = [functools.partial(model.process_request, FORMS_BY_NAME[f].request) for f in forms]
    run = run_in_threads(work, calls_per_thread=2)
    run.check()
    assert run.calls == THREADS * 2


def test_a_long_prompt_leaves_the_image_its_budget(request_runs):
    """Dynamic resolution budgets an image by what the prompt's text leaves of the context
    (``max_model_len - text - 4`` tokens): a 244-token text in a 256-token context leaves the
    image 8 tokens, and the processed prompt fits the context."""
    form = FORMS_BY_NAME["image-dynamic-long-prompt"]
    result = request_runs.run(form.name)
    length = len(result.prompt_token_ids)
    assert length <= form.spec.max_model_len, (
        f"the processed prompt has {length} tokens, the context {form.spec.max_model_len}: the "
        f"image took {len(result.items[0].positions)} tokens"
    )


def test_a_thin_image_under_a_tight_budget_is_processed(make_model):
    """A 16 x 545 image in a 21-token context (about 16 tokens left for it): the request path
    gives it a grid of whole 2 x 2 blocks that fits the context."""
    model = make_model(dynamic_resolution=True, max_model_len=21)
    request = Request("<image>", images=[pil_image(545, 16, 4)])
    result = model.run_request(request)
    _items_and_rows_agree(request, result, model.spec.hidden_size)
    assert len(result.prompt_token_ids) <= 21, f"{len(result.prompt_token_ids)} tokens"


def test_long_audio_is_encoded_in_30_second_clips(make_model):
    """A 70 s audio (vLLM PR #36671: encoded as one clip, the encoder's memory grows with the
    audio's length squared) is split into ceil(70 / 30) = 3 clips of 30, 30 and 10 s, encoded
    together; its placeholders are the clips' tokens by the architecture's rule (hop 160: 3000,
    3000 and 1000 frames; three stride-2 convolutions, L -> ceil(L / 2): 375 + 375 + 125)."""
    model = make_model()
    request = Request(PLACEHOLDER["audio"], audios=[audio_clip(70.0, 30)])
    result = model.run_request(request)
    _items_and_rows_agree(request, result, model.spec.hidden_size)
    assert model.calls.audio == [3], (
        f"audio encoder calls: expected one call with 3 clips, got clips per call "
        f"{model.calls.audio}"
    )
    positions = len(result.items[0].positions)
    assert positions == 375 + 375 + 125, f"audio placeholders: expected 875, got {positions}"


#: The budget's specs: the default, and the smallest an image can take (one 32 px tile of a
#: 2 x 2 patch grid is one row after the pixel shuffle; an engine limited to one tile per
#: image gives every image exactly one placeholder, so its budget is 1).
BUDGET_SPECS = {
    "static": ModelSpec(),
    "one-token-images": ModelSpec(image_size=32, max_num_tiles=1, audio=False),
}


@pytest.mark.parametrize("spec", BUDGET_SPECS.values(), ids=BUDGET_SPECS.keys())
def test_the_image_budget_is_the_most_an_image_takes(target, make_model, spec):
    """The tokens an engine reserves per image (``max_tokens_per_item``, vLLM PR #38727) are
    the most the target's processor gives one image: every tile grid of at most
    ``max_num_tiles`` tiles, as an image of exactly that grid's size, through the request path,
    its placeholders counted."""
    config = spec.vl_config()
    model = make_model(**dataclasses.asdict(spec))
    tile = config.force_image_size
    taken = {}
    for cols in range(1, config.max_num_tiles + 1):
        for rows in range(1, config.max_num_tiles // cols + 1):
            image = pil_image(rows * tile, cols * tile, cols * 100 + rows)
            processed = model.process_request(Request(PLACEHOLDER["image"], images=[image]))
            taken[cols, rows] = len(processed.items[0].positions)
    budget = target.metadata(spec, build_tokenizer()).max_tokens_per_item(4096, {"image": 1})
    most = max(taken.values())
    largest = [grid for grid, tokens in taken.items() if tokens == most]
    assert budget["image"] == most, (
        f"max_tokens_per_item['image']: expected {most}, the most the processor gave an image "
        f"(grids {largest}, cols x rows), got {budget['image']}"
    )


def test_an_image_sent_again_is_counted_for_its_new_context(make_model):
    """One image object sent to a dynamic-resolution checkpoint with a roomy context, then to one
    with a 12-token context: the second request gets the count its own context leaves the image,
    as a copy of the image does. A count cached per image (vLLM PR #38655's class: a class-level
    cache keyed by the image) must not serve the first context's count to the second. vLLM's
    parser hands the processor a fresh copy of every PIL image, so a cache keyed by ``id()`` of
    that copy is reached only when the allocator reuses an address, which this does not force."""
    roomy = make_model(dynamic_resolution=True)
    tight = make_model(dynamic_resolution=True, max_model_len=12)
    image = pil_image(320, 480, 5)
    request = Request("<image>", images=[image])
    first = roomy.run_request(request)
    again = tight.run_request(request)
    _items_and_rows_agree(request, again, tight.spec.hidden_size)
    copy = tight.run_request(Request("<image>", images=[image.copy()]))
    counts = [len(r.items[0].positions) for r in (first, again, copy)]
    assert counts[0] > counts[2], f"precondition: the contexts give the image {counts} tokens"
    assert counts[1] == counts[2], (
        f"the image sent again takes {counts[1]} tokens, its copy {counts[2]} (the roomy "
        f"context gave it {counts[0]}): the count follows the object, not the context"
    )
    length = len(again.prompt_token_ids)
    assert length <= 12, f"the prompt sent again has {length} tokens, the context 12"
