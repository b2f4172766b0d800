"""The implementations under test. One ``--target`` value picks one.

- ``reference``: our wrapper in ``reference_impl/``.
- ``vllm``: the installed vLLM's ``NemotronH_Nano_VL_V2``.
- ``vllm-file:PATH[,PATH...]``: model files from any vLLM revision or pull request, loaded in place
  of the installed modules.
"""

from __future__ import annotations

from pathlib import Path

from harness.targets.base import (
    EncoderCalls,
    ModelShell,
    ParsedModality,
    ShellSpec,
    Target,
    TargetIdentity,
    TargetLoadError,
    TargetUnavailable,
)

TARGET_CHOICES = ("reference", "vllm", "vllm-file:PATH[,PATH...]")


def resolve_target(value: str) -> Target:
    """The target a ``--target`` value names; :class:`TargetLoadError` for a bad value."""
    if value == "reference":
        from harness.targets.reference import ReferenceTarget

        return ReferenceTarget()
    if value == "vllm":
        from harness.targets.vllm import VllmTarget

        return VllmTarget()
    if value.startswith("vllm-file:"):
        from harness.targets.vllm import VllmFileTarget

        paths = [Path(p) for p in value.removeprefix("vllm-file:").split(",") if p]
        return VllmFileTarget(paths)
    raise TargetLoadError(f"--target: expected one of {', '.join(TARGET_CHOICES)}, got {value!r}")


__all__ = [
    "TARGET_CHOICES",
    "EncoderCalls",
    "ModelShell",
    "ParsedModality",
    "ShellSpec",
    "Target",
    "TargetIdentity",
    "TargetLoadError",
    "TargetUnavailable",
    "resolve_target",
]
