"""A video file's audio track, for requests that take it as an audio item (``audio_in_video``).

Decoded with PyAV (FFmpeg), the library vLLM decodes media with; imported on first use, so the
rest of the reference needs no media library. The track is bounded before and while it is
decoded: a file of a few kilobytes can declare or hold hours of audio, so a track whose declared
length is over the cap is refused from the container's metadata alone, and decoding stops, with
the same error, as soon as the samples pass the cap. Nothing is ever decoded whole past it.

Glossary: ``n`` samples (mono, at the model's sampling rate).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from reference_impl.errors import ConfigError


def _over_the_cap(field: str, cap_s: float, got: str) -> ConfigError:
    return ConfigError(field, f"an audio track of at most {cap_s:g} s (max_audio_duration_s)", got)


def _declared_seconds(container: Any, stream: Any) -> float | None:
    """The track's length as the container states it (the stream's, else the file's)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / 1_000_000  # FFmpeg's AV_TIME_BASE
    return None


def audio_track(data: bytes, sampling_rate: int, cap_s: float, field: str) -> torch.Tensor | None:
    """The first audio track of the media file ``data`` as ``[n]`` float32 mono samples at
    ``sampling_rate`` (FFmpeg's resampler mixes the channels down and converts the rate), or
    None when the file has no audio track.

    Raises :class:`ConfigError` naming ``field`` when ``data`` is not a readable container, when
    the track is over ``cap_s`` seconds (declared or decoded), or when it holds no samples.
    """
    import av

    try:
        container = av.open(io.BytesIO(data), "r")
    except av.FFmpegError as e:
        raise ConfigError(
            field, "a readable media container", f"{len(data)} bytes FFmpeg cannot open ({e})"
        ) from e
    with container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > cap_s:
            raise _over_the_cap(field, cap_s, f"a track declared {declared:.1f} s long")
        limit = cap_s * sampling_rate  # samples (a float: an infinite cap is no cap)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
        chunks: list[np.ndarray] = []
        decoded = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    decoded += chunks[-1].size
                if decoded > limit:
                    raise _over_the_cap(
                        field, cap_s, f"more than {decoded / sampling_rate:.1f} s decoded"
                    )
            chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
        except av.FFmpegError as e:
            raise ConfigError(field, "a decodable audio track", f"FFmpeg failed: {e}") from e
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if samples.size > limit:
        raise _over_the_cap(field, cap_s, f"{samples.size / sampling_rate:.1f} s decoded")
    if samples.size == 0:
        raise ConfigError(field, "an audio track with samples", "an empty track")
    return torch.from_numpy(samples.astype(np.float32, copy=False))
