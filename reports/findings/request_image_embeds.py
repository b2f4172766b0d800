"""vLLM 0.33.0: a request with precomputed image embeddings fails in NemotronH_Nano_VL_V2's
multimodal processor, before the model.

``_get_prompt_repl_image`` sets ``image_num_patches = [None] * len(image_embeds)`` and
``get_image_replacement`` then calls ``int(image_num_patches[item_idx])``:
``TypeError: int() argument must be ... not 'NoneType'``. Stacked ``[n, f, h]`` and list forms
both fail. Expected: each image's ``f`` rows fill ``<img>`` + ``f`` ``<image>`` tokens + ``</img>``.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_image_embeds.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from _processor import HIDDEN_SIZE, Folders, processor, reproduce

FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    embeds = torch.randn(2, 6, HIDDEN_SIZE)  # two images, six rows each
    return reproduce(lambda: p("<image> <image>", p.info.parse_mm_data({"image": embeds})))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
