"""vLLM 0.33.0: an image given as a numpy ``[H, W, 3]`` uint8 array fails in
NemotronH_Nano_VL_V2's processor.

vLLM's data parser accepts arrays as images (``ImageItem``), but ``dynamic_preprocess`` reads
``orig_width, orig_height = image.size`` as on a PIL image; an array's ``size`` is its element
count: ``TypeError: cannot unpack non-iterable int object``, re-raised as ``ValueError: Failed to
apply NanoNemotronVLProcessor``. The same image as a PIL image is processed.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_image_array.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from _processor import Folders, processor, reproduce

FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    image = np.zeros((60, 50, 3), dtype=np.uint8)
    return reproduce(lambda: p("Look: <image>.", p.info.parse_mm_data({"image": [image]})))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
