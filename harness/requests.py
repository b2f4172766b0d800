"""A user's multimodal request, and what a serving engine makes of it.

A :class:`Request` is what a user hands an engine: prompt text with ``<image>``, ``<video>`` and
``<so_embedding>`` placeholders, and the media or precomputed embeddings for them, in vLLM's
``multi_modal_data`` form (:meth:`Request.multi_modal_data`). A target runs it the way its engine
does (:meth:`harness.targets.base.Target.run_request`): its processor expands the prompt and makes
the model's inputs, its batching groups them, its model embeds them. The result
(:class:`RequestResult`) lists every item in prompt order with the prompt positions its
embedding fills, the embedding, and the batches ``embed_multimodal`` was called with.

:data:`REQUEST_FORMS` is the catalogue the request-path suites run: every input form a user can
send, each on the checkpoint variant it needs. Media are deterministic functions of a seed.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from harness.checkpoint import ModelSpec

#: vLLM's modality names, as a request's ``multi_modal_data`` keys them.
RequestModality = Literal["image", "video", "audio"]
#: The prompt placeholder of one item of each modality.
PLACEHOLDER = {"image": "<image>", "video": "<video>", "audio": "<so_embedding>"}
AUDIO_SAMPLE_RATE = 16000
#: The engine setting that caps an audio track's decoded length (vLLM's, whole seconds); the
#: reference target honours it too.
AUDIO_DECODE_CAP_ENV = "VLLM_MAX_AUDIO_DECODE_DURATION_S"
#: Its value when unset (vLLM's default).
DEFAULT_AUDIO_DECODE_CAP_S = 600


def audio_decode_cap_s() -> int:
    """The audio decode cap in force (:data:`AUDIO_DECODE_CAP_ENV`), in seconds."""
    value = os.environ.get(AUDIO_DECODE_CAP_ENV, str(DEFAULT_AUDIO_DECODE_CAP_S))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{AUDIO_DECODE_CAP_ENV}: expected whole seconds, got {value!r}") from None


@dataclass(frozen=True)
class VideoClip:
    """Decoded frames ``[F, H, W, 3]`` (uint8) with the metadata a video loader gives them."""

    frames: np.ndarray
    fps: float
    frames_indices: tuple[int, ...]

    def metadata(self) -> dict[str, object]:
        """vLLM's video metadata for these frames (``video_needs_metadata``)."""
        total = max(self.frames_indices) + 1
        return {
            "fps": self.fps,
            "frames_indices": list(self.frames_indices),
            "total_num_frames": total,
            "duration": total / self.fps,
            "video_backend": "opencv",
        }


@dataclass(frozen=True)
class VideoFile(VideoClip):
    """A video file (``data``: the container's bytes) with its frames as a loader decodes them.

    Its metadata carries the bytes as vLLM's ``nemotron_vl`` video loader keeps them
    (``original_video_bytes``), for a request that asks for the file's audio track too
    (:attr:`Request.audio_in_video`).
    """

    data: bytes
    #: the length of the file's audio track (None: the file has none)
    audio_seconds: float | None = None

    def metadata(self) -> dict[str, object]:
        return {**super().metadata(), "original_video_bytes": self.data}

    def sampled(self, num_frames: int) -> VideoFile:
        """The file as a video loader told to sample ``num_frames`` frames decodes it
        (``--media-io-kwargs '{"video": {"num_frames": N}}'``): frames spread evenly over the
        clip, the first and the last kept (``floor(i * (F - 1) / (N - 1))``; all ``F`` when
        ``N >= F``)."""
        if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
            raise ValueError(f"num_frames: expected a positive int, got {num_frames!r}")
        total = len(self.frames_indices)
        if num_frames >= total:
            return self
        if num_frames == 1:
            picks = [0]
        else:
            picks = [i * (total - 1) // (num_frames - 1) for i in range(num_frames)]
        return dataclasses.replace(
            self,
            frames=self.frames[picks],
            frames_indices=tuple(self.frames_indices[i] for i in picks),
        )


def track_seconds(video: object) -> float | None:
    """The length of a video item's audio track: None for frames without a file, or a file
    without a track."""
    return video.audio_seconds if isinstance(video, VideoFile) else None


#: One modality's items: media (PIL images or ``[H, W, 3]`` uint8 arrays; clips; mono float32
#: audio at :data:`AUDIO_SAMPLE_RATE`), or precomputed embeddings: a stacked ``[n, f, h]`` tensor
#: or a list of ``[f_i, h]`` tensors.
Items = list[Any] | torch.Tensor


@dataclass(frozen=True)
class Request:
    """A prompt and its multimodal data, as a user sends them to an engine."""

    prompt: str
    images: Items = field(default_factory=list)
    videos: Items = field(default_factory=list)
    audios: Items = field(default_factory=list)
    #: vLLM's ``use_audio_in_video`` processor option: each video's audio track (the videos are
    #: :class:`VideoFile` items) is also an audio item, placed after the video's placeholder.
    audio_in_video: bool = False

    def processor_kwargs(self) -> dict[str, object]:
        """vLLM's ``mm_processor_kwargs`` for this request."""
        return {"use_audio_in_video": True} if self.audio_in_video else {}

    def items(self, modality: RequestModality) -> Items:
        return {"image": self.images, "video": self.videos, "audio": self.audios}[modality]

    def num_items(self, modality: RequestModality) -> int:
        """Items of ``modality`` the request carries."""
        return len(self.items(modality))

    def expected_items(self, modality: RequestModality) -> int:
        """Items of ``modality`` the engine must make of the request: those it carries, and with
        :attr:`audio_in_video` an audio item for each video file with a track."""
        count = self.num_items(modality)
        if modality == "audio" and self.audio_in_video and count == 0:
            count = sum(track_seconds(v) is not None for v in self.videos)
        return count

    def embeddings(self, modality: RequestModality) -> list[torch.Tensor] | None:
        """The precomputed embeddings given for ``modality``, one ``[f, h]`` tensor per item, or
        None when the modality's items are media."""
        items = self.items(modality)
        if isinstance(items, torch.Tensor):
            return list(items.unbind(0))
        if items and all(isinstance(item, torch.Tensor) for item in items):
            return list(items)
        return None

    def multi_modal_data(self) -> dict[str, object]:
        """vLLM's ``multi_modal_data`` for this request."""
        data: dict[str, object] = {}
        if self.num_items("image"):
            data["image"] = self.images
        if self.num_items("video"):
            videos = self.videos
            data["video"] = (
                videos
                if self.embeddings("video") is not None
                else [(clip.frames, clip.metadata()) for clip in videos]
            )
        if self.num_items("audio"):
            data["audio"] = [(audio, AUDIO_SAMPLE_RATE) for audio in self.audios]
        return data


@dataclass(frozen=True)
class RequestItem:
    """One multimodal item of a processed request.

    Attributes:
        modality: ``"image"``, ``"video"`` or ``"audio"``.
        index: the item's index among the request's items of its modality.
        positions: the prompt positions its embedding rows fill, in order.
    """

    modality: str
    index: int
    positions: tuple[int, ...]


@dataclass(frozen=True)
class ItemFeatures:
    """What a target's processor hands a tower for one item, before the engine casts it to the
    model's dtype: the floating features (pixel values, log-mel features) and their masks, by
    the processor's keyword names: floating tensors in the dtype the processor made them (fp32,
    or the checkpoint's dtype where the processor casts itself: vLLM's pixel values), masks
    bool."""

    modality: str
    index: int
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ProcessedRequest:
    """A target's processor output for a request: the expanded prompt and every item's
    placeholder positions, in prompt order (nothing embedded)."""

    prompt_token_ids: list[int]
    items: list[RequestItem]


@dataclass(frozen=True)
class Batch:
    """One ``embed_multimodal`` call: its modality, item count, and keyword names (those whose
    value was None apart)."""

    modality: str
    num_items: int
    keys: tuple[str, ...]
    none_keys: tuple[str, ...] = ()

    @staticmethod
    def of(modality: str, num_items: int, kwargs: dict[str, object]) -> Batch:
        keys = tuple(k for k, v in kwargs.items() if v is not None)
        return Batch(modality, num_items, keys, tuple(k for k in kwargs if k not in keys))


@dataclass
class RequestResult:
    """What a target's engine made of a request.

    Attributes:
        prompt_token_ids: the expanded prompt.
        items: every multimodal item, in prompt order.
        embeddings: ``embed_multimodal``'s output for each item, in the same order.
        batches: each ``embed_multimodal`` call, in call order.
    """

    prompt_token_ids: list[int]
    items: list[RequestItem]
    embeddings: list[torch.Tensor]
    batches: list[Batch]

    def item(self, modality: str, index: int) -> tuple[RequestItem, torch.Tensor]:
        for item, embedding in zip(self.items, self.embeddings, strict=True):
            if (item.modality, item.index) == (modality, index):
                return item, embedding
        raise LookupError(f"no {modality} item {index} in the result")


# ---------------------------------------------------------------------------------------------
# Media


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def image_array(height: int, width: int, seed: int) -> np.ndarray:
    """An ``[H, W, 3]`` uint8 RGB image."""
    return _rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def pil_image(height: int, width: int, seed: int) -> Any:
    from PIL import Image

    return Image.fromarray(image_array(height, width, seed))


def video_clip(num_frames: int, height: int, width: int, seed: int, stride: int = 2) -> VideoClip:
    """``num_frames`` frames sampled every ``stride`` source frames at 2 fps."""
    frames = _rng(seed).integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    return VideoClip(frames, 2.0, tuple(range(0, num_frames * stride, stride)))


def video_of_scenes(scenes: str, height: int, width: int, seed: int) -> VideoClip:
    """One frame per letter of ``scenes`` at 2 fps, each distinct letter one random image: a
    repeated letter is a frame that did not change (what EVS prunes first)."""
    rng = _rng(seed)
    images = {
        s: rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for s in sorted(set(scenes))
    }
    frames = np.stack([images[s] for s in scenes])
    return VideoClip(frames, 2.0, tuple(range(len(scenes))))


def audio_clip(seconds: float, seed: int) -> np.ndarray:
    """Mono float32 noise at :data:`AUDIO_SAMPLE_RATE`."""
    samples = int(seconds * AUDIO_SAMPLE_RATE)
    return (0.1 * _rng(seed).standard_normal(samples)).astype(np.float32)


def video_file(
    num_frames: int,
    height: int,
    width: int,
    seed: int,
    *,
    audio_seconds: float | None,
    audio_rate: int = AUDIO_SAMPLE_RATE,
    audio_channels: Literal[1, 2] = 1,
    tone_hz: float = 440.0,
) -> VideoFile:
    """A Matroska file made with PyAV: ``num_frames`` noise frames at 2 fps (MPEG-4 Part 2) and,
    unless ``audio_seconds`` is None, a ``tone_hz`` tone of that length (16-bit PCM at
    ``audio_rate``; mono by default, decoded sample for sample at :data:`AUDIO_SAMPLE_RATE`;
    with two channels, the tone in both); its frames decoded back."""
    import av

    if audio_channels not in (1, 2):
        raise ValueError(f"video_file: audio_channels: expected 1 or 2, got {audio_channels!r}")
    layout = "mono" if audio_channels == 1 else "stereo"

    fps = 2
    frames = _rng(seed).integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as container:
        video = container.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        audio = None
        if audio_seconds is not None:
            audio = container.add_stream("pcm_s16le", rate=audio_rate, layout=layout)
        for index, array in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if audio is not None and audio_seconds is not None:
            samples = round(audio_seconds * audio_rate)
            t = np.arange(samples) / audio_rate
            tone = (0.3 * 32767 * np.sin(2 * np.pi * tone_hz * t)).astype(np.int16)
            # Packed 16-bit PCM: the channels' samples interleaved in one row.
            pcm = np.repeat(tone, audio_channels)[None]
            for start in range(0, samples, 1024):
                chunk = av.AudioFrame.from_ndarray(
                    pcm[:, start * audio_channels : (start + 1024) * audio_channels],
                    format="s16",
                    layout=layout,
                )
                chunk.sample_rate, chunk.pts = audio_rate, start
                container.mux(audio.encode(chunk))
            container.mux(audio.encode(None))
    data = buffer.getvalue()
    with av.open(io.BytesIO(data), "r") as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return VideoFile(np.stack(decoded), float(fps), tuple(range(len(decoded))), data, audio_seconds)


def video_file_with_audio(seconds: float, seed: int, tone_hz: float = 440.0) -> VideoFile:
    """A two-frame 64 x 64 video file whose audio track, a ``tone_hz`` tone, lasts
    ``seconds``."""
    return video_file(2, 64, 64, seed, audio_seconds=seconds, tone_hz=tone_hz)


def video_file_without_audio(seed: int) -> VideoFile:
    """A two-frame 64 x 64 video file with no audio track."""
    return video_file(2, 64, 64, seed, audio_seconds=None)


def embedding_rows(rows: int, hidden_size: int, seed: int) -> torch.Tensor:
    """``[rows, h]`` float32 embeddings."""
    return torch.randn(rows, hidden_size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class RequestForm:
    """One input form a user can send, on the checkpoint variant it needs."""

    name: str
    spec: ModelSpec
    build: Callable[[ModelSpec], Request]

    @functools.cached_property
    def request(self) -> Request:
        return self.build(self.spec)


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
MTP = ModelSpec(mtp=True)  # vision_final_layernorm before the pixel shuffle
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


def _image_long_prompt(spec: ModelSpec) -> Request:
    # 244 text tokens in a 256-token context: the image's budget is 256 - 244 - 4 = 8 tokens.
    text = "Describe this picture in detail please. " * 6 + "Answer: "
    return Request(text[:244] + "<image>", images=[pil_image(100, 150, 3)])


def _video(spec: ModelSpec) -> Request:
    return Request("Watch <video> closely.", videos=[video_clip(5, 64, 64, 5)])


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
    RequestForm("images-mtp", MTP, _images_pil),
    RequestForm("image-dynamic-long-prompt", DYNAMIC_SHORT, _image_long_prompt),
    RequestForm("video-t1", STATIC, _video),
    RequestForm("videos-t2", TEMPORAL_2, _videos_two),
    RequestForm("audios", STATIC, _audio),
    RequestForm("audios-hop-128", HOP_128, _audio),  # token counts follow a non-default hop
    RequestForm("audios-no-conv-bias", NO_CONV_BIAS, _audio),
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
