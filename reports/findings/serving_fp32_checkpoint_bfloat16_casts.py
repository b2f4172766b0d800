"""vLLM 0.33.0: a checkpoint saved in float32, served in float32, fails every image, video and
audio request: the towers' outputs are cast to a hard-coded bfloat16 before the fp32 connector.

``NemotronH_Nano_VL_V2.extract_feature`` and ``extract_feature_dynamic`` cast RADIO's features
with ``vit_embeds.to(dtype=torch.bfloat16)`` before ``mlp1``, and ``ProjectedParakeet.forward``
(``vllm/model_executor/models/parakeet.py``) casts the encoder output with
``outputs.to(dtype=torch.bfloat16)`` before its projection. With ``vllm serve FOLDER --dtype
float32`` on an fp32 checkpoint the vision tower, ``mlp1``, the sound encoder and its projection
are all fp32, so each request raises ``RuntimeError: expected m1 and m2 to have the same dtype,
but got: c10::BFloat16 != float`` in ``mlp1`` (images, videos) or in the sound projection
(audio). Expected: the connector and the projection receive the features in the model's dtype
(cast to ``self.llm_dtype``, or no cast).

It needs a variant of the checkpoint folder (weights saved in float32). Run it with vLLM alone
against the checkpoint folder the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-fp32 --checkpoint-dtype float32
    python reports/findings/serving_fp32_checkpoint_bfloat16_casts.py /tmp/nnvl-tiny-fp32
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, Served, reproduce_silent, served_request_problems

FOLDERS = Folders(checkpoint_dtype="float32")
#: Its own dtype. (``--dtype auto`` serves an fp32 checkpoint in bfloat16: vLLM downcasts it.)
OPTIONS = ("--dtype", "float32")


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    served = Served(folder, OPTIONS)

    def wrong() -> str | None:
        problems = served_request_problems(served, ("image", "video", "audio"))
        if not problems:
            return None
        return f"{' '.join(OPTIONS)} on a float32 checkpoint: {'; '.join(problems)}"

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
