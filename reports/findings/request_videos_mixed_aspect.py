"""vLLM 0.33.0: two videos of different aspect ratios fail in NemotronH_Nano_VL_V2's processor.

With ``vision_config.video_maintain_aspect_ratio`` (the value the published Omni checkpoint
states, per vLLM's own model registry) and ``video_target_num_patches``, each video's frames are
resized to a grid of its own aspect ratio; ``NanoNemotronVLProcessor._preprocess_video`` then
concatenates every video's frames into one tensor: ``RuntimeError: Sizes of tensors must match``,
re-raised as ``ValueError: Failed to apply NanoNemotronVLProcessor`` with the videos' pixels in
its message. Expected: each video processed at its own size, as it is alone.

It needs a variant of the checkpoint folder (video frames resized keeping their aspect ratio).
Run it with vLLM alone against the folder the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-video-aspect --video-aspect-patches 36
    python reports/findings/request_videos_mixed_aspect.py /tmp/nnvl-tiny-video-aspect
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from _processor import Folders, processor, reproduce

FOLDERS = Folders(video_aspect_patches=36)


def _video(frames: int, height: int, width: int) -> tuple[np.ndarray, dict[str, object]]:
    """Random frames sampled at 2 fps, with the metadata vLLM's video loader gives them."""
    pixels = np.random.default_rng(frames).integers(0, 256, (frames, height, width, 3), np.uint8)
    metadata = {
        "fps": 2.0,
        "duration": frames / 2.0,
        "total_num_frames": frames,
        "frames_indices": list(range(frames)),
        "video_backend": "opencv",
    }
    return pixels, metadata


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    portrait, landscape = _video(3, 96, 48), _video(2, 48, 96)
    alone = p("<video>", p.info.parse_mm_data({"video": [portrait]}))  # each alone: processed
    p("<video>", p.info.parse_mm_data({"video": [landscape]}))
    assert alone is not None
    both = p.info.parse_mm_data({"video": [portrait, landscape]})
    return reproduce(lambda: p("<video><video>", both))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
