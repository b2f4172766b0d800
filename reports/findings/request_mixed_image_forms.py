"""vLLM 0.33.0: one request whose images mix a precomputed embedding and a PIL image fails with
a bare ``AttributeError: 'Image' object has no attribute 'ndim'`` in vLLM's data parser (it
takes the first item's form for the whole list), which names neither the input nor what was
expected. Expected: a ValueError saying images must be all media or all embeddings.
"""

from __future__ import annotations

import sys

import torch
from _processor import HIDDEN_SIZE, processor, reproduce
from PIL import Image


def main() -> int:
    p = processor()
    images = [torch.randn(3, HIDDEN_SIZE), Image.new("RGB", (32, 32))]
    return reproduce(lambda: p("<image> <image>", p.info.parse_mm_data({"image": images})))


if __name__ == "__main__":
    sys.exit(main())
