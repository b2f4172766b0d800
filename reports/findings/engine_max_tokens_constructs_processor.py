"""vLLM 0.33.0: NemotronH_Nano_VL_V2's ``get_mm_max_tokens_per_item`` constructs
``NanoNemotronVLProcessor`` (twice for static tiles), and each construction tokenizes the special
tokens with the shared tokenizer: the metadata path vLLM PR #38655 took the processor out of.
The engine calls it whenever it builds a ``MultiModalBudget`` (input processor, scheduler, model
runner). Expected: the answer from the config, no processor.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/engine_max_tokens_constructs_processor.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _processor import Folders, processor, reproduce

FOLDERS = Folders()


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    p = processor(folder)
    constructed = []
    construct = p.info.ctx.init_processor

    def counted(*args: object, **kwargs: object) -> object:
        constructed.append(args[0])
        return construct(*args, **kwargs)

    object.__setattr__(p.info.ctx, "init_processor", counted)  # a frozen dataclass

    def ask() -> None:
        p.info.get_mm_max_tokens_per_item(seq_len=4096, mm_counts={"image": 1})
        if constructed:
            raise RuntimeError(f"constructed the processor {len(constructed)} times")

    return reproduce(ask)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
