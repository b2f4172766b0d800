"""The ``vllm`` and ``vllm-file:`` targets, one module per part.

- :mod:`.runtime`: the CPU environment, the process-wide vLLM runtime, post-load processing;
- :mod:`.files`: model files from another revision loaded in place of the installed modules;
- :mod:`.build`: engine configs from a checkpoint folder, vLLM's constructor and loader;
- :mod:`.model`: the built model as the suites drive it;
- :mod:`.requests`: a user's request through vLLM's processor, engine boundary and batching;
- :mod:`.cache`: the caches vLLM sizes for a served model (KV, Mamba state, hybrid blocks);
- :mod:`.lora`: vLLM's LoRA manager on a model built with a LoRA config, as its runner serves;
- :mod:`.tensor_parallel`: each rank's weight shard under ``--tensor-parallel-size N``, built
  and loaded in one process with the tensor-parallel group's size and rank faked;
- :mod:`.target`: the targets' named methods.
"""

from harness.targets.vllm.target import VllmFileTarget, VllmTarget

__all__ = ["VllmFileTarget", "VllmTarget"]
