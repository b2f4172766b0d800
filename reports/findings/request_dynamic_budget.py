"""vLLM 0.33.0: with dynamic resolution, NemotronH_Nano_VL_V2's processor budgets an image as if
the prompt had no text, so a long prompt's processed length exceeds max_model_len.

The tiler's token budget is ``max_model_len - text_prompt_len - 4``, but vLLM calls the HF
processor on dummy text (``_get_hf_mm_text``: just the placeholders), so ``text_prompt_len`` is 0
whatever the prompt: a 244-token text plus a 100 x 150 image in a 256-token context becomes a
261-token prompt (the image takes 15 tokens, 8 fit). Expected: the image shrinks to the budget
the text leaves.

It needs a variant of the checkpoint folder (dynamic resolution, a 256-token context). Run it
with vLLM alone against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-dynamic-256 --dynamic --max-model-len 256
    python reports/findings/request_dynamic_budget.py /tmp/nnvl-tiny-dynamic-256
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, processor, reproduce
from PIL import Image

FOLDERS = Folders(dynamic=True, max_model_len=256)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    text = ("Describe this picture in detail please. " * 6 + "Answer: ")[:244]
    image = Image.new("RGB", (150, 100))

    def request() -> None:
        out = p(text + "<image>", p.info.parse_mm_data({"image": [image]}))
        length = len(out["prompt_token_ids"])
        if length > 256:
            raise ValueError(f"the processed prompt has {length} tokens, max_model_len 256")

    return reproduce(request)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
