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

It needs a variant of the checkpoint folder (a LoRA adapter folder). Run it with vLLM alone
against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny --adapter towers-only /tmp/nnvl-lora/towers-only
    python reports/findings/lora_tower_modules_ignored.py /tmp/nnvl-tiny /tmp/nnvl-lora/towers-only
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, ServedWithLoRA, reproduce_silent

#: RADIO's qkv / proj / fc1 / fc2 and Parakeet's attention projections, nothing else.
FOLDERS = Folders(adapters=("towers-only",))


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, (adapter,) = FOLDERS.resolve(argv, __file__)
    from safetensors import safe_open

    served = ServedWithLoRA(checkpoint)  # --enable-lora --max-loras 2 --max-lora-rank 8
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as tensors:
        modules = {key.split(".lora_")[0] for key in tensors.keys()}  # noqa: SIM118

    def wrong() -> str | None:
        applied, told = served.add(1, adapter)
        towers = ("vision_model", "sound_encoder", "radio")
        if applied or any(t in message for message in told for t in towers):
            return None  # applied, or the user told of the tower modules
        return (
            f"an adapter of {len(modules)} tower modules loaded: applied to none, nothing said "
            f"(warnings and log records at WARNING: {told})"
        )

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
