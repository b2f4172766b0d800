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
"""

from __future__ import annotations

import sys

from _processor import reproduce


def main() -> int:
    from harness.checkpoint import ModelSpec
    from harness.lora_adapters import ADAPTERS_BY_NAME, adapter_folder
    from harness.targets import resolve_target
    from harness.targets.base import LoRAOptions

    spec = ModelSpec()
    served = resolve_target("vllm").lora(spec, LoRAOptions())  # vLLM's LRUCacheWorkerLoRAManager
    folder = adapter_folder(spec, ADAPTERS_BY_NAME["lm-embeddings"])
    return reproduce(lambda: served.add(1, folder))


if __name__ == "__main__":
    sys.exit(main())
