"""The ``reference`` target, one module per part (the shape of :mod:`harness.targets.vllm`).

- :mod:`.model`: the reference model of a checkpoint folder as the suites drive it;
- :mod:`.requests`: a user's request through the reference processor and model;
- :mod:`.lora`: the reference model served with its LM-only LoRA;
- :mod:`.mutant`: the ``reference-mutant:NAME`` target, the reference with one upstream bug
  class put back;
- :mod:`.target`: the target's named methods.
"""

from harness.targets.reference.target import ReferenceTarget

__all__ = ["ReferenceTarget"]
