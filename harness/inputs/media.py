"""The media of requests: images, video clips and files, audio, embedding rows.

Each is a deterministic function of a seed, so a failing check names the exact input.
"""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np
import torch

from harness.inputs.requests import AUDIO_SAMPLE_RATE, VideoClip, VideoFile


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


def sampled_clip(
    num_frames: int, height: int, width: int, seed: int, *, fps: float, seconds: float
) -> VideoClip:
    """A ``seconds`` long clip at ``fps`` as vLLM's video loader samples ``num_frames`` of its
    frames: ``total = max(1, round(seconds * fps))`` source frames, ``min(num_frames, total)``
    of them at the indices ``linspace(0, total - 1, n)`` cast to int (vLLM 0.33.0's uniform
    sampling), with the source frame rate (a decoder reports 24000/1001 as 23.976...)."""
    if not fps > 0 or not seconds > 0:
        raise ValueError(f"fps, seconds: expected positive numbers, got {fps!r}, {seconds!r}")
    total = max(1, round(seconds * fps))
    count = min(num_frames, total)
    indices = np.linspace(0, total - 1, count).astype(int)
    frames = _rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    return VideoClip(frames, float(fps), tuple(int(i) for i in indices))


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
    return audio_samples(int(seconds * AUDIO_SAMPLE_RATE), seed)


def audio_samples(samples: int, seed: int) -> np.ndarray:
    """``samples`` of mono float32 noise at :data:`AUDIO_SAMPLE_RATE`."""
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
    # Bit-exact: no random segment id, date or encoder tag, so a file is the same bytes in
    # every run (the oracle's cache keys requests by their content).
    with av.open(
        buffer, "w", format="matroska", container_options={"fflags": "+bitexact"}
    ) as container:
        video = container.add_stream("mpeg4", rate=fps, options={"flags": "+bitexact"})
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
