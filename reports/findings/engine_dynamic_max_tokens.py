"""vLLM 0.33.0: for a dynamic-resolution checkpoint, NemotronH_Nano_VL_V2's
``get_mm_max_tokens_per_item`` ignores ``max_num_patches``.

It sizes the image for the whole token budget (``width_and_height_for_max_num_tokens_available``:
3969 tokens in a 4096-token context), while the processor caps every image at
``max_num_patches`` (64 patches here: 16 tokens after the pixel shuffle). The engine reserves its
encoder budget per image from this answer: 248 times too much.

It needs a variant of the checkpoint folder (dynamic resolution). Run it with vLLM alone
against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-dynamic --dynamic
    python reports/findings/engine_dynamic_max_tokens.py /tmp/nnvl-tiny-dynamic
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, processor, reproduce

FOLDERS = Folders(dynamic=True)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)

    def ask() -> None:
        tokens = p.info.get_mm_max_tokens_per_item(seq_len=4096, mm_counts={"image": 1})
        if tokens["image"] > 16:
            raise ValueError(f"max tokens per image {tokens['image']}; 64 patches give 16")

    return reproduce(ask)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
