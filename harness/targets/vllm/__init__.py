"""The ``vllm`` and ``vllm-file:`` targets, one module per part.

- :mod:`.runtime`: the CPU environment, the process-wide vLLM runtime, post-load processing;
- :mod:`.files`: model files from another revision loaded in place of the installed modules;
- :mod:`.build`: engine configs from a checkpoint folder, vLLM's constructor and loader;
- :mod:`.model`: the built model as the suites drive it;
- :mod:`.target`: the targets' named methods.
"""

from harness.targets.vllm.target import VllmFileTarget, VllmTarget

__all__ = ["VllmFileTarget", "VllmTarget"]
