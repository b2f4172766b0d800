"""Every model the vLLM target builds and shares, run under a caller's wrapper.

A model is built once per process and shared by every check that asks for the same one, so what
a build does (the constructor's lines, the config fields it reads) happens in the first such
check only. A measurement that must credit a build to every check that used it (the mutation
score's reach map, the config-field inventory) wraps each use with :func:`patch_builds`: its
``around_build(key, spec, build)`` runs the use (``key`` names the model: the same key, the
same shared model; ``spec`` is its checkpoint variant; the first use builds it, a later one
finds it built) and notes the check that asked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from harness.checkpoints.serving import DEFAULT_SERVING
from harness.checkpoints.spec import ModelSpec


class AroundBuild(Protocol):
    def __call__(self, key: str, spec: ModelSpec, build: Callable[[], Any]) -> Any: ...


def patch_builds(around_build: AroundBuild, patch: pytest.MonkeyPatch) -> None:
    """Every use of a model the vLLM target builds and shares runs inside ``around_build``, for
    as long as ``patch`` holds: the first use builds it, and every later one (a cache hit, which
    builds nothing) still notes the check that asked."""
    from harness.targets.vllm.target import VllmTarget

    model = VllmTarget.model
    fresh_model = VllmTarget.fresh_model

    @functools.wraps(model)
    def counted_model(self: VllmTarget, spec: Any, device: Any, serving: Any = None) -> Any:
        serving = DEFAULT_SERVING if serving is None else serving
        key = repr(("build", spec, str(device), serving.model_options()))
        return around_build(key, spec, lambda: model(self, spec, device, serving))

    @functools.wraps(fresh_model)
    def counted_fresh(self: VllmTarget, spec: Any, text_only: bool) -> Any:
        key = repr(("fresh", spec, text_only))
        return around_build(key, spec, lambda: fresh_model(self, spec, text_only))

    patch.setattr(VllmTarget, "model", counted_model)
    patch.setattr(VllmTarget, "fresh_model", counted_fresh)
