"""vLLM 0.33.0: broken LoRA adapters are refused without saying which adapter or file is wrong,
or not refused at all.

Served through vLLM's ``LRUCacheWorkerLoRAManager`` (``--enable-lora --max-lora-rank 8``):

- rank 16: ``ValueError: LoRA rank 16 is greater than max_lora_rank 8.`` (no adapter named);
- ``adapter_model.safetensors`` of garbage: safetensors' own ``SafetensorError: Error while
  deserializing header: header too large`` (no adapter or file named);
- no ``adapter_model.safetensors``: ``ValueError: <folder> doesn't contain tensors`` (not which
  file is missing);
- an adapter that adds tokens (``added_tokens.json``, ``new_embeddings.safetensors``): loaded,
  the added tokens silently ignored.

Reproduced while all four stand; a fix of any prints which ones remain.

It needs a variant of the checkpoint folder (LoRA adapter folders). Run it with vLLM alone
against the folders the harness writes (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny \
        --adapter broken-rank-above-max /tmp/nnvl-lora/rank-above-max \
        --adapter broken-corrupt-file /tmp/nnvl-lora/corrupt-file \
        --adapter broken-missing-file /tmp/nnvl-lora/missing-file \
        --adapter broken-extends-vocabulary /tmp/nnvl-lora/extends-vocabulary
    python reports/findings/lora_broken_adapters.py /tmp/nnvl-tiny \
        /tmp/nnvl-lora/rank-above-max \
        /tmp/nnvl-lora/corrupt-file \
        /tmp/nnvl-lora/missing-file \
        /tmp/nnvl-lora/extends-vocabulary
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, ServedWithLoRA, reproduce_silent

#: What vLLM says of each broken adapter (its folder is named after the kind).
EXPECTED = {
    "rank-above-max": "ValueError: LoRA rank 16 is greater than max_lora_rank 8.",
    "corrupt-file": "SafetensorError: Error while deserializing header",
    "missing-file": "doesn't contain tensors",
    "extends-vocabulary": "loaded",
}
FOLDERS = Folders(adapters=tuple(f"broken-{kind}" for kind in EXPECTED))


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, adapters = FOLDERS.resolve(argv, __file__)
    served = ServedWithLoRA(checkpoint, max_lora_rank=8)  # --enable-lora --max-lora-rank 8

    def wrong() -> str | None:
        seen: dict[str, str] = {}
        for adapter_id, (kind, folder) in enumerate(zip(EXPECTED, adapters, strict=True), 1):
            try:
                served.add(adapter_id, folder)
                seen[kind] = "loaded"
            except Exception as e:
                seen[kind] = f"{type(e).__name__}: {e}"
        standing = [k for k, text in EXPECTED.items() if text in seen.get(k, "")]
        if len(standing) < len(EXPECTED):
            print(f"fixed: {sorted(set(EXPECTED) - set(standing))}; seen: {seen}")
            return None
        return "; ".join(f"{k}: {seen[k][:90]}" for k in sorted(seen))

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
