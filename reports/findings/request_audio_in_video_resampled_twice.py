"""vLLM 0.33.0: with ``use_audio_in_video``, a video's 16 kHz audio track is resampled twice,
through 22050 Hz: it comes out shorter and its features differ from the same track's.

``_extract_audio_from_videos`` calls ``load_audio_pyav`` with its default ``sr=22050``. FFmpeg's
resampler turns the 2 s, 16 kHz track into 44078 samples at 22050 Hz (22 short of 2 s: its delay
is not flushed), and vLLM's data parser resamples those to the model's 16 kHz: 31984 samples,
not the track's 32000. The same track sent as an audio item, decoded at its own rate by the same
``load_audio_pyav(sr=None)``, gives other log-mel features: the track's have one feature frame
fewer, and the common frames differ (by units at the first and last frames, where the resamplers
start and stop, and by about 0.1 between). The model's audio embeddings of the track differ from
the track's own by about 10 % (relative), beyond bf16's rounding (``test_parity.py``).

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_audio_in_video_resampled_twice.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from io import BytesIO
from typing import Any

from _processor import Folders, processor, reproduce_silent, video_file

SECONDS = 2.0
FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    import torch
    from vllm.multimodal.media.audio import load_audio_pyav

    p = processor(folder)
    video = video_file(SECONDS)

    def features(out: Any) -> torch.Tensor:
        """The audio item's log-mel features from vLLM's processor output."""
        item = out["mm_kwargs"]["audio"][0]
        features: torch.Tensor = item["input_audio_features"].data.float()
        return features

    def wrong() -> str | None:
        items = p.info.parse_mm_data({"video": [(video.frames, video.metadata())]})
        from_video = features(
            p("Watch <video>.", items, hf_processor_mm_kwargs={"use_audio_in_video": True})
        )
        track, rate = load_audio_pyav(BytesIO(video.data), sr=None)  # the track at its own rate
        items = p.info.parse_mm_data({"audio": [(track, rate)]})
        as_audio = features(p("Hear <so_embedding>.", items))
        if from_video.shape == as_audio.shape and torch.allclose(from_video, as_audio, atol=0.05):
            return None
        decoded, decoded_rate = load_audio_pyav(BytesIO(video.data))  # vLLM's call
        frames = min(from_video.shape[1], as_audio.shape[1])
        difference = (from_video[:, :frames] - as_audio[:, :frames]).abs().amax(dim=(0, 2))
        return (
            f"a {SECONDS:g} s track of {len(track)} samples at {rate} Hz is decoded at "
            f"{decoded_rate:g} Hz ({len(decoded)} samples) and resampled to 16 kHz: "
            f"{from_video.shape[1]} feature frames, {as_audio.shape[1]} for the same track sent "
            f"as audio; the common frames differ by up to {float(difference.max()):.3g} (first "
            f"frame {float(difference[0]):.3g}, median {float(difference.median()):.3g})"
        )

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
