"""vLLM 0.33.0: a LoRA adapter that trains the token embedding, named as the checkpoint names
it (``language_model.backbone.embeddings``), is refused.

A PEFT adapter trained on the checkpoint names the embedding's factors
``base_model.model.language_model.backbone.embeddings.lora_embedding_A`` / ``_B``.
``NemotronH_Nano_VL_V2.hf_to_vllm_mapper`` maps the prefix ``language_model.backbone`` to
``language_model.model`` but not the module: vLLM's embedding module is ``embed_tokens``, so
``LoRAModel.from_local_checkpoint`` raises "expected target modules in {...} but received
['language_model.model.embeddings', ...]". The same factors saved under
``language_model.model.embed_tokens`` load and apply. (The weight loader maps ``embeddings`` to
``embed_tokens`` for the checkpoint's own tensors.)

It needs a variant of the checkpoint folder (a LoRA adapter folder). Run it with vLLM alone
against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny --adapter lm-embeddings /tmp/nnvl-lora/lm-embeddings
    python reports/findings/lora_embedding_checkpoint_name.py /tmp/nnvl-tiny \
        /tmp/nnvl-lora/lm-embeddings
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, ServedWithLoRA, reproduce

FOLDERS = Folders(adapters=("lm-embeddings",))


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, (adapter,) = FOLDERS.resolve(argv, __file__)
    served = ServedWithLoRA(checkpoint)  # --enable-lora --max-loras 2 --max-lora-rank 8
    return reproduce(lambda: served.add(1, adapter))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
