"""A user's multimodal request, and what a serving engine makes of it.

A :class:`Request` is what a user hands an engine: prompt text with ``<image>``, ``<video>`` and
``<so_embedding>`` placeholders, and the media or precomputed embeddings for them (each target's
adapter writes them in its engine's form: vLLM's ``multi_modal_data`` in
:mod:`harness.targets.vllm.requests`). A target runs it the way its engine
does (:meth:`harness.targets.base.Target.run_request`): its processor expands the prompt and makes
the model's inputs, its batching groups them, its model embeds them. The result
(:class:`RequestResult`) lists every item in prompt order with the prompt positions its
embedding fills, the embedding, and the batches ``embed_multimodal`` was called with.

The media live in :mod:`harness.inputs.media`, the catalogue of forms in
:mod:`harness.inputs.catalogue`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

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


@dataclass(frozen=True)
class AudioClip:
    """Mono float32 samples at ``rate`` Hz, as a user sends audio recorded at another rate than
    the model's (a plain array is at :data:`AUDIO_SAMPLE_RATE`): the engine's media loader
    resamples it to the model's rate (vLLM's ``(samples, rate)`` audio item)."""

    samples: np.ndarray
    rate: int

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int) or self.rate <= 0:
            raise ValueError(f"AudioClip.rate: expected a positive int (Hz), got {self.rate!r}")
        if not isinstance(self.samples, np.ndarray) or self.samples.ndim != 1:
            got = getattr(self.samples, "shape", type(self.samples).__name__)
            raise ValueError(f"AudioClip.samples: expected a [n] array, got {got}")


def audio_with_rate(item: object) -> tuple[Any, int]:
    """An audio item of a request as ``(samples, rate)``."""
    if isinstance(item, AudioClip):
        return item.samples, item.rate
    return item, AUDIO_SAMPLE_RATE


def track_seconds(video: object) -> float | None:
    """The length of a video item's audio track: None for frames without a file, or a file
    without a track."""
    return video.audio_seconds if isinstance(video, VideoFile) else None


#: One modality's items: media (PIL images or ``[H, W, 3]`` uint8 arrays; clips; mono float32
#: audio at :data:`AUDIO_SAMPLE_RATE`, or an :class:`AudioClip` at another rate), or precomputed
#: embeddings: a stacked ``[n, f, h]`` tensor
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
    #: vLLM's ``max_num_tiles`` processor option for this request alone
    #: (``mm_processor_kwargs``): at most this many static tiles per image (None: the engine's).
    max_num_tiles: int | None = None

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
