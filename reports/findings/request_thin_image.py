"""vLLM 0.33.0: a 1470 x 5 image fails in NemotronH_Nano_VL_V2's dynamic-resolution processor.

``DynamicResolutionImageTiler`` floors the 5-pixel side to 0 patches (patch 16) and then
computes ``sqrt(min_num_patches / 0)``: ``ZeroDivisionError``, re-raised as ``ValueError: Failed to
apply NanoNemotronVLProcessor``. Expected: at least one patch each way.
"""

from __future__ import annotations

import sys

from _processor import processor, reproduce
from PIL import Image


def main() -> int:
    p = processor(dynamic_resolution=True)
    banner = Image.new("RGB", (1470, 5))
    return reproduce(lambda: p("<image>", p.info.parse_mm_data({"image": [banner]})))


if __name__ == "__main__":
    sys.exit(main())
