"""vLLM 0.33.0: one request whose images mix a precomputed embedding and a PIL image fails with
a bare ``AttributeError: 'Image' object has no attribute 'ndim'`` in vLLM's data parser (it
takes the first item's form for the whole list), which names neither the input nor what was
expected. Expected: a ValueError saying images must be all media or all embeddings.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_mixed_image_forms.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from _processor import HIDDEN_SIZE, Folders, processor, reproduce
from PIL import Image

FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    images = [torch.randn(3, HIDDEN_SIZE), Image.new("RGB", (32, 32))]
    return reproduce(lambda: p("<image> <image>", p.info.parse_mm_data({"image": images})))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
