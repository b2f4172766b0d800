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
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _processor import reproduce_silent


def main() -> int:
    from harness.checkpoint import ModelSpec
    from harness.lora_adapters import BROKEN_ADAPTERS, write_broken_adapter
    from harness.targets import resolve_target
    from harness.targets.base import LoRAOptions

    spec, options = ModelSpec(), LoRAOptions(max_lora_rank=8)
    served = resolve_target("vllm").lora(spec, options)  # vLLM's LRUCacheWorkerLoRAManager
    expected = {
        "rank-above-max": "ValueError: LoRA rank 16 is greater than max_lora_rank 8.",
        "corrupt-file": "SafetensorError: Error while deserializing header",
        "missing-file": "doesn't contain tensors",
        "extends-vocabulary": "loaded",
    }

    def wrong() -> str | None:
        seen: dict[str, str] = {}
        with tempfile.TemporaryDirectory() as root:
            for adapter_id, kind in enumerate(sorted(BROKEN_ADAPTERS), start=1):
                if kind not in expected:
                    continue
                folder = write_broken_adapter(spec, kind, Path(root) / kind, options.max_lora_rank)
                try:
                    served.add(adapter_id, folder)
                    seen[kind] = "loaded"
                except Exception as e:
                    seen[kind] = f"{type(e).__name__}: {e}"
        standing = [k for k, text in expected.items() if text in seen.get(k, "")]
        if len(standing) < len(expected):
            print(f"fixed: {sorted(set(expected) - set(standing))}; seen: {seen}")
            return None
        return "; ".join(f"{k}: {seen[k][:90]}" for k in sorted(seen))

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main())
