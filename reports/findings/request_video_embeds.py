"""vLLM 0.33.0: a request with precomputed video embeddings fails in NemotronH_Nano_VL_V2's
multimodal processor.

``get_video_replacement`` does ``video, metadata = mm_items["video"][item_idx]``; for an
embedding item that unpacks the ``[f, h]`` tensor's rows: ``ValueError: too many values to
unpack (expected 2)``. Behind it, ``_get_video_fields_config`` has no ``video_embeds`` entry, so
``MultiModalKwargsItems.from_hf_inputs`` would drop the embeddings even once the prompt expands,
although the model itself routes ``video_embeds`` since vLLM PR #56398.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/request_video_embeds.py /tmp/nnvl-tiny
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
    embeds = [torch.randn(9, HIDDEN_SIZE)]  # one video, nine rows
    return reproduce(lambda: p("Watch <video>.", p.info.parse_mm_data({"video": embeds})))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
