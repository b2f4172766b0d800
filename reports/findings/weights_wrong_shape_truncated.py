"""vLLM 0.33.0: a language-model or RADIO tensor longer than its parameter loads without an
error, truncated.

``ColumnParallelLinear.weight_loader`` and ``QKVParallelLinear.weight_loader``
(``vllm/model_executor/layers/linear.py``) narrow the checkpoint tensor to the parameter's shard
(``loaded_weight.narrow(output_dim, tp_rank * shard_size, shard_size)``) before they assert the
shapes agree, and Mamba2's ``mamba_v2_sharded_weight_loader`` copies the rows its config's sizes
name without looking at the tensor's: a checkpoint whose ``q_proj``, ``up_proj``, ``in_proj``,
``conv1d`` or RADIO ``fc1`` tensor has more rows than the model built from its config (a config that disagrees with its
weights, or a size vLLM read wrongly) is served with the first rows, silently. The towers'
``default_weight_loader`` refuses the same mistake (an ``AssertionError`` that does not name
the tensor). Expected: an error naming the tensor and both shapes.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/weights_wrong_shape_truncated.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, Served

FOLDERS = Folders()
#: One tensor of each language-model layer kind the loaders above take (checkpoint names).
TENSORS = (
    "language_model.backbone.layers.0.mixer.in_proj.weight",  # Mamba2: its sharded loader
    "language_model.backbone.layers.0.mixer.conv1d.weight",  # Mamba2: its sharded loader
    "language_model.backbone.layers.2.mixer.q_proj.weight",  # attention: QKVParallelLinear
    "language_model.backbone.layers.1.mixer.up_proj.weight",  # MLP: ColumnParallelLinear
    "vision_model.radio_model.model.blocks.3.mlp.fc1.weight",  # RADIO: ColumnParallelLinear
    # Refused, but by a bare assertion that names no tensor (default_weight_loader):
    "mlp1.1.weight",
    "sound_encoder.encoder.layers.0.self_attn.q_proj.weight",
)


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from safetensors import safe_open

    folder, _ = FOLDERS.resolve(argv, __file__)
    served = Served(folder)
    silent = []
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        for name in TENSORS:
            tensor = weights.get_tensor(name)
            longer = torch.cat([tensor, tensor[:1]])  # one row more than the config's sizes give
            try:
                served.model.load_weights([(name, longer)])
            except Exception as e:  # refused: the expected outcome
                print(f"refused {name}: {type(e).__name__}: {e}"[:300])
                continue
            silent.append(f"{name} {tuple(longer.shape)}")
    if not silent:
        print("NOT REPRODUCED: every tensor of another shape was refused")
        return 1
    print(f"REPRODUCED: loaded without an error, truncated: {'; '.join(silent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
