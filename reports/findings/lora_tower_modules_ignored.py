"""vLLM 0.33.0: a LoRA adapter that names RADIO or Parakeet modules loads, and those modules
are silently left unadapted.

``NemotronH_Nano_VL_V2`` has LoRA for its language model only (PR #56231): the LoRA manager
wraps no tower layer ("no matching PunicaWrapper is found ... will be ignored", logged once per
RADIO layer when the manager is made, not when an adapter loads). Its supported module names
still include the towers' (``qkv``, ``proj``, ``fc1``, ``fc2``; Parakeet's ``q_proj`` ...), so
``LoRAModel.from_local_checkpoint`` accepts an adapter trained on them; ``activate_adapter``
then finds no LoRA layer for them and moves on. The user is told nothing: an adapter of the
towers alone loads and changes nothing. (An adapter naming the connector ``mlp1.1`` is refused
with a clear error naming it.)
"""

from __future__ import annotations

import sys

from _processor import reproduce_silent


def main() -> int:
    from harness.checkpoint import ModelSpec
    from harness.lora_adapters import ADAPTERS_BY_NAME, adapter_folder, adapter_tensors
    from harness.targets import resolve_target
    from harness.targets.base import LoRAOptions

    spec = ModelSpec()
    adapter = ADAPTERS_BY_NAME["towers-only"]  # RADIO qkv/proj/fc1/fc2, Parakeet attention
    served = resolve_target("vllm").lora(spec, LoRAOptions())  # vLLM's LRUCacheWorkerLoRAManager

    def wrong() -> str | None:
        load = served.add(1, adapter_folder(spec, adapter))
        modules = {key.split(".lora_")[0] for key in adapter_tensors(spec, adapter)}
        towers = ("vision_model", "sound_encoder", "radio")
        if load.applied or any(t in message for message in load.told for t in towers):
            return None  # applied, or the user told of the tower modules
        return (
            f"an adapter of {len(modules)} tower modules loaded: applied to none, nothing said "
            f"(warnings and log records at WARNING: {load.told})"
        )

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main())
