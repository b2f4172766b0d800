"""vLLM 0.33.0: served with a ``--dtype`` other than the checkpoint's saved dtype, every image and
video request fails in the vision tower, and audio embeddings come back in the saved dtype.

``NemotronH_Nano_VL_V2.__init__`` takes ``llm_dtype = self.language_model.config.dtype``: the
HF ``text_config``'s dtype, i.e. the checkpoint's saved ``torch_dtype``, not the served
``model_config.dtype``. It moves the RADIO vision tower, ``mlp1`` and the Parakeet sound encoder
to it (``.to(llm_dtype)``, ``ProjectedParakeet(dtype=llm_dtype)``), while the language model is
built in the served dtype and vLLM's processing context casts pixel values to the served dtype.
``vllm serve FOLDER --dtype float16`` on a bf16 checkpoint (a GPU without bf16): an image or
video request raises ``RuntimeError: expected m1 and m2 to have the same dtype, but got:
c10::Half != c10::BFloat16`` in RADIO's patch embedder; an audio request's embeddings (the
encoder runs in bf16, ``_process_audio_input`` casts its input to ``llm_dtype``) are bf16, not
the served float16. ``--dtype float32`` fails the same way (``float != c10::BFloat16``).
Expected: the towers and the connector in the served dtype, every embedding in it.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/serving_dtype_towers_in_checkpoint_dtype.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, Served, served_request_problems

FOLDERS = Folders()  # saved in bfloat16
OPTIONS = ("--dtype", "float16")  # vllm serve FOLDER --dtype float16
#: The modules ``__init__`` moves to ``llm_dtype``: RADIO, the connector, Parakeet.
TOWERS = ("vision_model", "mlp1", "sound_encoder")


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    served = Served(folder, OPTIONS)
    problems = served_request_problems(served, ("image", "video", "audio"))
    dtypes = {
        str(parameter.dtype)
        for name in TOWERS
        for parameter in getattr(served.model, name).parameters()
    }
    if dtypes == {str(served.dtype)}:
        # Fixed. (The hard-coded bfloat16 casts of serving_fp32_checkpoint_bfloat16_casts.py
        # may still fail these requests; they are that finding's.)
        print(f"NOT REPRODUCED: the towers are in the served {served.dtype}; requests: {problems}")
        return 1
    towers = f"({', '.join(TOWERS)} in {', '.join(sorted(dtypes))})"
    said = f"{' '.join(OPTIONS)} on a bfloat16 checkpoint: {'; '.join(problems)} {towers}"
    print(f"REPRODUCED: {said}"[:600])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
