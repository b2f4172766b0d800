"""vLLM 0.33.0: with ``use_audio_in_video``, a video whose audio track is 16-bit stereo at
22050 Hz is read as twice its length.

``_extract_audio_from_videos`` calls ``load_audio_pyav`` with its default ``sr=22050``. For a
track already at that rate it skips FFmpeg's resampler and takes each decoded frame's
``to_ndarray()`` as is: packed 16-bit stereo is one row of interleaved left and right samples
(unscaled int16 values), which the mono average over rows leaves alone. The 2 s track below
becomes 4 s of audio: 50 placeholders instead of 25.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_audio_in_video_22050_stereo.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, processor, reproduce_silent, video_file

SECONDS = 2.0
#: 2 s at 16 kHz: 200 feature frames, three stride-2 convolutions -> 100 -> 50 -> 25.
EXPECTED_PLACEHOLDERS = 25
FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    video = video_file(SECONDS, audio_rate=22050, audio_channels=2)

    def wrong() -> str | None:
        items = p.info.parse_mm_data({"video": [(video.frames, video.metadata())]})
        out = p("Watch <video>.", items, hf_processor_mm_kwargs={"use_audio_in_video": True})
        counts = [r.get_num_embeds() for r in out["mm_placeholders"].get("audio", [])]
        if counts == [EXPECTED_PLACEHOLDERS]:
            return None
        return (
            f"a {SECONDS:g} s track at 22050 Hz stereo got audio placeholders {counts}, "
            f"expected [{EXPECTED_PLACEHOLDERS}]"
        )

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
