"""vLLM 0.33.0: a language-model bias the config says the layer has not is dropped without an
error.

``AutoWeightsLoader.load_weights`` (``vllm/model_executor/models/utils.py``) appends ``.bias`` to
its ``ignore_unexpected_suffixes`` on every call, whatever the checkpoint's quantization ("Ignore
unexpected biases (typically from GPTQ models)"), and ``NemotronHForCausalLM.load_weights`` loads
through it: a checkpoint whose Mamba or MLP layers carry biases while its ``text_config`` says
``use_bias`` / ``mlp_bias`` false (a config that disagrees with its weights, or a switch vLLM read
wrongly) is served without them, silently. Any other tensor the model has no parameter for is
refused by name. Expected: the same error naming the tensor.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/weights_unexpected_bias_dropped.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, Served

FOLDERS = Folders()
#: Biases of layers whose config switch is off in the folder (checkpoint names), and a tensor of
#: another name the loader refuses, for comparison.
BIASES = (
    "language_model.backbone.layers.0.mixer.in_proj.bias",  # Mamba2: use_bias
    "language_model.backbone.layers.0.mixer.out_proj.bias",  # Mamba2: use_bias
    "language_model.backbone.layers.1.mixer.up_proj.bias",  # MLP: mlp_bias
)
REFUSED = "language_model.backbone.layers.0.mixer.mystery.weight"


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from safetensors import safe_open

    folder, _ = FOLDERS.resolve(argv, __file__)
    served = Served(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        rows = {
            name: weights.get_tensor(name.replace(".bias", ".weight")).shape[0] for name in BIASES
        }
    try:
        served.model.load_weights([(REFUSED, torch.zeros(4))])
        print(f"(for comparison) {REFUSED}: loaded without an error too")
    except Exception as e:
        print(f"(for comparison) refused {REFUSED}: {type(e).__name__}: {e}"[:200])
    dropped = []
    for name in BIASES:
        try:
            served.model.load_weights([(name, torch.ones(rows[name]))])
        except Exception as e:  # refused: the expected outcome
            print(f"refused {name}: {type(e).__name__}: {e}"[:300])
            continue
        dropped.append(name)
    if not dropped:
        print("NOT REPRODUCED: every bias without a parameter was refused")
        return 1
    print(f"REPRODUCED: dropped without an error: {'; '.join(dropped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
