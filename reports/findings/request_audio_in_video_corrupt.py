"""vLLM 0.33.0: with ``use_audio_in_video``, a video whose file FFmpeg cannot open loses its
audio track without an error.

``NanoNemotronVLMultiModalProcessor._extract_audio_from_videos`` decodes each video's
``original_video_bytes`` with ``load_audio_pyav``, which raises ``ValueError('Invalid or
corrupted audio data...')`` for such bytes, and catches every exception as "no audio stream
found" (logged at debug level): the request goes on with the video alone, although the user
asked for its track.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_audio_in_video_corrupt.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from _processor import Folders, processor, reproduce_silent

FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    frames = np.zeros((2, 64, 64, 3), dtype=np.uint8)
    metadata = {
        "fps": 2.0,
        "frames_indices": [0, 1],
        "total_num_frames": 2,
        "duration": 1.0,
        "video_backend": "opencv",
        "original_video_bytes": b"this is not a video file",
    }

    def wrong() -> str | None:
        items = p.info.parse_mm_data({"video": [(frames, metadata)]})
        out = p("Watch <video>.", items, hf_processor_mm_kwargs={"use_audio_in_video": True})
        modalities = sorted(out["mm_placeholders"])
        if "audio" in modalities:
            return None
        return f"no error, and the request's items are {modalities}: the track was dropped"

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
