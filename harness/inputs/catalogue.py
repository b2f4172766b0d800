"""The catalogue the request-path suites run: every input form a user can send.

:data:`REQUEST_FORMS` holds each form (a :class:`RequestForm`: a name, the checkpoint variant
it needs and its request); :data:`CONTENT_PAIRS` holds pairs of requests that differ in content
only, one per tower path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs.media import (
    audio_clip,
    embedding_rows,
    image_array,
    pil_image,
    video_clip,
    video_file_with_audio,
    video_file_without_audio,
    video_of_scenes,
)
from harness.inputs.requests import Request, RequestModality


@dataclass(frozen=True)
class RequestForm:
    """One input form a user can send, on the checkpoint variant it needs."""

    name: str
    spec: ModelSpec
    build: Callable[[ModelSpec], Request]

    @functools.cached_property
    def request(self) -> Request:
        return self.build(self.spec)

    def request_for(self, spec: ModelSpec) -> Request:
        """The request sent to another variant ``spec``: the same, with precomputed embeddings
        as wide as ``spec``'s language model (the one size of a request a variant sets)."""
        if spec.hidden_size == self.spec.hidden_size:
            return self.request
        return self.build(dataclasses.replace(self.spec, hidden_size=spec.hidden_size))


STATIC = ModelSpec()
DYNAMIC = ModelSpec(dynamic_resolution=True)
TEMPORAL_2 = ModelSpec(video_temporal_patch_size=2)
HOP_128 = ModelSpec(audio_hop_length=128)
DYNAMIC_SHORT = ModelSpec(dynamic_resolution=True, max_model_len=256)
# EVS: rates and scenes chosen so that the kept tokens are whole groups, the cut never among
# near-equal scores (a repeated frame scores 0, a new random one far above): bf16 targets keep
# the same tokens as the fp32 reference.
EVS_T1 = ModelSpec(video_pruning_rate=0.5)
EVS_T2 = ModelSpec(video_temporal_patch_size=2, video_pruning_rate=0.25)
EVS_NEAR_1 = ModelSpec(video_pruning_rate=0.95)
# vision_final_layernorm before the pixel shuffle, with an epsilon (vision_config's
# layer_norm_eps) that moves the rows: the features' variance is about 12 and mlp1's RMS norm
# cancels most of a token's scale, so against 1e-6 an epsilon of 1 moves them by 0.2% (under
# bf16's noise), 1000 by 16%.
MTP = ModelSpec(mtp=True, vision_final_layernorm_eps=1000.0)
# One token per 4 x 4 patches (a static tile is one token): the pixel shuffle's other ratio.
QUARTER_SHUFFLE = ModelSpec(downsample_ratio=0.25)
SHUFFLE_V1 = ModelSpec(ps_version="v1")  # the legacy shuffle: each tile's tokens transposed
AUDIO_8KHZ = ModelSpec(audio_sampling_rate=8000)  # Parakeet's features at 8 kHz
# RADIO without CPE: its position table is the tile's size (``cpe_max_size`` = the preferred
# resolution, 8 x 8 patches), so a grid of another size crops the table before resizing it,
# where CPE resizes it to the longer side first. The tile is not the default's, so a target
# that reads the preferred resolution wrongly (as the default's 64 px) switches CPE on.
DYNAMIC_NO_CPE = ModelSpec(dynamic_resolution=True, image_size=128, cpe_max_size=128)
# Video frames resized to about 36 patches keeping their aspect ratio: a 2:1 frame becomes a
# 4 x 8 patch grid (8 tokens), where the tile would be 4 x 4 (4 tokens) and a square target
# 6 x 6 (9 tokens).
VIDEO_ASPECT = ModelSpec(video_target_num_patches=36, video_maintain_aspect_ratio=True)
NO_CONV_BIAS = ModelSpec(audio_convolution_bias=False)  # Omni's Parakeet, biases in the file


def _images_pil(spec: ModelSpec) -> Request:
    # Sizes that tile differently: one tile plus none, and a 2 x 1 grid plus the thumbnail.
    return Request(
        "Look: <image> and <image>.", images=[pil_image(60, 50, 1), pil_image(70, 140, 2)]
    )


def _images_array(spec: ModelSpec) -> Request:
    return Request("Look: <image>.", images=[image_array(60, 50, 1)])


def _images_dynamic(spec: ModelSpec) -> Request:
    return Request(
        "Look: <image> and <image>.", images=[pil_image(100, 150, 3), pil_image(40, 64, 4)]
    )


def _image_portrait(spec: ModelSpec) -> Request:
    # Taller than wide: on the dynamic path RADIO's position embeddings, interpolated to the
    # longer side, are cropped in width (a landscape image crops them in height).
    return Request("Look: <image>.", images=[pil_image(150, 60, 5)])


def _image_fewer_tiles(spec: ModelSpec) -> Request:
    # A wide image the engine would cut into 12 static tiles and a thumbnail; this request
    # alone asks for at most 2 (vLLM's per-request mm_processor_kwargs).
    return Request("Look: <image>.", images=[pil_image(100, 300, 1)], max_num_tiles=2)


def _image_long_prompt(spec: ModelSpec) -> Request:
    # 244 text tokens in a 256-token context: the image's budget is 256 - 244 - 4 = 8 tokens.
    text = "Describe this picture in detail please. " * 6 + "Answer: "
    return Request(text[:244] + "<image>", images=[pil_image(100, 150, 3)])


def _video(spec: ModelSpec) -> Request:
    return Request("Watch <video> closely.", videos=[video_clip(5, 64, 64, 5)])


def _video_tall(spec: ModelSpec) -> Request:
    # Portrait, twice as tall as wide: a target that swaps width and height fails here.
    return Request("Watch <video> closely.", videos=[video_clip(5, 96, 48, 38)])


def _videos_two(spec: ModelSpec) -> Request:
    return Request(
        "First <video>, then <video>.", videos=[video_clip(4, 64, 64, 6), video_clip(2, 64, 64, 7)]
    )


def _audio(spec: ModelSpec) -> Request:
    return Request(
        "Hear <so_embedding> and <so_embedding>.",
        audios=[audio_clip(1.0, 8), audio_clip(0.45, 9)],
    )


def _image_embeds_stacked_one(spec: ModelSpec) -> Request:
    return Request("Look: <image>.", images=embedding_rows(6, spec.hidden_size, 10)[None])


def _image_embeds_stacked(spec: ModelSpec) -> Request:
    stacked = torch.stack([embedding_rows(4, spec.hidden_size, s) for s in (11, 12, 13)])
    return Request("<image> <image> <image>", images=stacked)


def _image_embeds_list(spec: ModelSpec) -> Request:
    return Request(
        "<image> and <image>",
        images=[embedding_rows(3, spec.hidden_size, 14), embedding_rows(7, spec.hidden_size, 15)],
    )


def _video_embeds_one(spec: ModelSpec) -> Request:
    return Request("Watch <video>.", videos=embedding_rows(9, spec.hidden_size, 16)[None])


def _video_embeds_list(spec: ModelSpec) -> Request:
    return Request(
        "<video> then <video>",
        videos=[embedding_rows(5, spec.hidden_size, 17), embedding_rows(2, spec.hidden_size, 18)],
    )


def _mixed(spec: ModelSpec) -> Request:
    return Request(
        "A <image>, a <video>, a <so_embedding> and <image>.",
        images=[pil_image(60, 50, 19), pil_image(70, 140, 20)],
        videos=[video_clip(3, 64, 64, 21)],
        audios=[audio_clip(0.6, 22)],
    )


def _video_evs(spec: ModelSpec) -> Request:
    # 6 groups of 4 at rate 0.5: keep 12, the first frame, the first B and the first C.
    return Request("Watch <video> closely.", videos=[video_of_scenes("ABBCCC", 64, 64, 30)])


def _videos_evs_t2(spec: ModelSpec) -> Request:
    # Tubelets AA BB BB CC at rate 0.25: keep 12 of 16, all but the repeated BB; DD: one
    # tubelet, kept whole.
    return Request(
        "First <video>, then <video>.",
        videos=[video_of_scenes("AABBBBCC", 64, 64, 31), video_of_scenes("DD", 64, 64, 32)],
    )


def _video_evs_near_1(spec: ModelSpec) -> Request:
    # Rate 0.95 keeps max(4, floor(16 * 0.05)) = 4 tokens: the first frame's.
    return Request("Watch <video>.", videos=[video_of_scenes("ABCD", 64, 64, 33)])


def _video_evs_one_frame(spec: ModelSpec) -> Request:
    return Request("Watch <video>.", videos=[video_of_scenes("A", 64, 64, 34)])


def _video_audio_in_video(spec: ModelSpec) -> Request:
    return Request(
        "Watch <video> closely.", videos=[video_file_with_audio(2.0, 35)], audio_in_video=True
    )


def _videos_audio_in_video_one_silent(spec: ModelSpec) -> Request:
    # The first file has a track, the second none: items video, audio, video.
    return Request(
        "First <video>, then <video>.",
        videos=[video_file_with_audio(2.0, 36), video_file_without_audio(37)],
        audio_in_video=True,
    )


REQUEST_FORMS: tuple[RequestForm, ...] = (
    RequestForm("images-pil", STATIC, _images_pil),
    RequestForm("images-array", STATIC, _images_array),
    RequestForm("images-dynamic", DYNAMIC, _images_dynamic),
    RequestForm("image-dynamic-portrait", DYNAMIC, _image_portrait),
    RequestForm("images-dynamic-no-cpe", DYNAMIC_NO_CPE, _images_dynamic),
    RequestForm("image-fewer-tiles-per-request", STATIC, _image_fewer_tiles),
    RequestForm("images-mtp", MTP, _images_pil),
    RequestForm("images-quarter-shuffle", QUARTER_SHUFFLE, _images_pil),
    RequestForm("images-shuffle-v1", SHUFFLE_V1, _images_pil),
    RequestForm("image-dynamic-long-prompt", DYNAMIC_SHORT, _image_long_prompt),
    RequestForm("video-t1", STATIC, _video),
    RequestForm("videos-t2", TEMPORAL_2, _videos_two),
    RequestForm("video-keeps-aspect", VIDEO_ASPECT, _video_tall),
    RequestForm("audios", STATIC, _audio),
    RequestForm("audios-hop-128", HOP_128, _audio),  # token counts follow a non-default hop
    RequestForm("audios-no-conv-bias", NO_CONV_BIAS, _audio),
    RequestForm("audios-8khz-model", AUDIO_8KHZ, _audio),
    RequestForm("image-embeds-stacked-one", STATIC, _image_embeds_stacked_one),
    RequestForm("image-embeds-stacked", STATIC, _image_embeds_stacked),
    RequestForm("image-embeds-list", STATIC, _image_embeds_list),
    RequestForm("video-embeds-stacked-one", STATIC, _video_embeds_one),
    RequestForm("video-embeds-list", STATIC, _video_embeds_list),
    RequestForm("mixed", STATIC, _mixed),
    RequestForm("video-evs-t1", EVS_T1, _video_evs),
    RequestForm("videos-evs-t2", EVS_T2, _videos_evs_t2),
    RequestForm("video-evs-near-1", EVS_NEAR_1, _video_evs_near_1),
    RequestForm("video-evs-one-frame", EVS_T1, _video_evs_one_frame),
    RequestForm("video-audio-in-video", STATIC, _video_audio_in_video),
    RequestForm("videos-audio-in-video-one-silent", STATIC, _videos_audio_in_video_one_silent),
)
FORMS_BY_NAME = {form.name: form for form in REQUEST_FORMS}


def forms_for(spec: ModelSpec, names: Collection[str] | None = None) -> tuple[RequestForm, ...]:
    """The catalogued forms (those ``names``, or all) a variant can serve: not those with audio
    (clips, or a video's track) on a variant without an audio tower."""
    unknown = sorted(set(names or ()) - set(FORMS_BY_NAME))
    if unknown:
        raise KeyError(f"names: not catalogued request forms: {unknown}")
    return tuple(
        form
        for form in REQUEST_FORMS
        if (names is None or form.name in names)
        and (spec.audio or form.request.expected_items("audio") == 0)
    )


# ---------------------------------------------------------------------------------------------
# Pairs of requests that differ in content only


@dataclass(frozen=True)
class ContentPair:
    """Two requests down one path of the model: the same prompt, the same item sizes and so the
    same placeholders, different content (``build(spec, variant)`` for variants 0 and 1). A
    path whose output does not move between them cannot fail a parity check for a bug in it.

    ``modality``: the items whose rows the path computes (a video file's audio track: audio).
    """

    path: str
    spec: ModelSpec
    modality: RequestModality
    build: Callable[[ModelSpec, int], Request]

    @functools.cached_property
    def requests(self) -> tuple[Request, Request]:
        return self.build(self.spec, 0), self.build(self.spec, 1)


def _one_image(spec: ModelSpec, variant: int) -> Request:
    # A 2 x 1 grid of tiles and the thumbnail (static), a 6 x 10 patch grid (dynamic).
    size = (100, 150) if spec.dynamic_resolution else (70, 140)
    return Request("Look: <image>.", images=[pil_image(*size, seed=40 + variant)])


def _one_video(spec: ModelSpec, variant: int) -> Request:
    return Request("Watch <video>.", videos=[video_clip(4, 64, 64, seed=42 + variant)])


def _one_video_of_scenes(spec: ModelSpec, variant: int) -> Request:
    # EVS keeps the same groups of both (the scenes repeat in the same places).
    return Request("Watch <video>.", videos=[video_of_scenes("ABBCCC", 64, 64, seed=44 + variant)])


def _one_audio(spec: ModelSpec, variant: int) -> Request:
    return Request("Hear <so_embedding>.", audios=[audio_clip(1.0, seed=46 + variant)])


def _one_video_file_track(spec: ModelSpec, variant: int) -> Request:
    # The same frames; the track a 440 Hz or a 620 Hz tone.
    video = video_file_with_audio(2.0, 48, tone_hz=(440.0, 620.0)[variant])
    return Request("Watch <video>.", videos=[video], audio_in_video=True)


CONTENT_PAIRS: tuple[ContentPair, ...] = (
    ContentPair("image-static", STATIC, "image", _one_image),
    ContentPair("image-dynamic", DYNAMIC, "image", _one_image),
    ContentPair("image-mtp", MTP, "image", _one_image),
    ContentPair("video-t1", STATIC, "video", _one_video),
    ContentPair("video-t2", TEMPORAL_2, "video", _one_video),
    ContentPair("video-evs", EVS_T1, "video", _one_video_of_scenes),
    ContentPair("audio-hop-160", STATIC, "audio", _one_audio),
    ContentPair("audio-hop-128", HOP_128, "audio", _one_audio),
    ContentPair("audio-no-conv-bias", NO_CONV_BIAS, "audio", _one_audio),
    ContentPair("audio-in-video", STATIC, "audio", _one_video_file_track),
)
PAIRS_BY_PATH = {pair.path: pair for pair in CONTENT_PAIRS}
