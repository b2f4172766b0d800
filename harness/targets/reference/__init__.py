"""The ``reference`` target, one module per part (the shape of :mod:`harness.targets.vllm`).

- :mod:`.model`: the reference model of a checkpoint folder as the suites drive it;
- :mod:`.target`: the target's named methods.
"""

from harness.targets.reference.target import ReferenceTarget

__all__ = ["ReferenceTarget"]
