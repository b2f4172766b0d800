"""vLLM 0.33.0: a 1470 x 5 image fails in NemotronH_Nano_VL_V2's dynamic-resolution processor.

``DynamicResolutionImageTiler`` floors the 5-pixel side to 0 patches (patch 16) and then
computes ``sqrt(min_num_patches / 0)``: ``ZeroDivisionError``, re-raised as ``ValueError: Failed to
apply NanoNemotronVLProcessor``. Expected: at least one patch each way.

It needs a variant of the checkpoint folder (dynamic resolution). Run it with vLLM alone
against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-dynamic --dynamic
    python reports/findings/request_thin_image.py /tmp/nnvl-tiny-dynamic
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, processor, reproduce
from PIL import Image

FOLDERS = Folders(dynamic=True)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    banner = Image.new("RGB", (1470, 5))
    return reproduce(lambda: p("<image>", p.info.parse_mm_data({"image": [banner]})))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
