"""Every model the vLLM target builds and shares, run under a caller's wrapper.

A model is built once per process and shared by every check that asks for the same one, so what
a build does (the constructor's lines, the config fields it reads) happens in the first such
check only. A measurement that must credit a build to every check that used it (the mutation
score's reach map, the config-field inventory) wraps each build with :func:`patch_builds`: its
``around_build(key, spec, build)`` runs the build (``key`` names the model: the same key, the
same shared model; ``spec`` is its checkpoint variant) and can note the check that asked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from harness.checkpoints.spec import ModelSpec


class AroundBuild(Protocol):
    def __call__(self, key: str, spec: ModelSpec, build: Callable[[], Any]) -> Any: ...


def patch_builds(around_build: AroundBuild, patch: pytest.MonkeyPatch) -> None:
    """Every model the vLLM target builds and shares runs inside ``around_build``, for as long as
    ``patch`` holds."""
    from harness.targets.vllm.target import VllmTarget

    build_model = VllmTarget.build_model
    fresh_model = VllmTarget.fresh_model

    @functools.wraps(build_model)
    def counted_build(self: VllmTarget, spec: Any, folder: Any, device: Any, serving: Any) -> Any:
        key = repr(("build", spec, str(folder), serving.model_options()))
        return around_build(key, spec, lambda: build_model(self, spec, folder, device, serving))

    @functools.wraps(fresh_model)
    def counted_fresh(self: VllmTarget, spec: Any, text_only: bool) -> Any:
        key = repr(("fresh", spec, text_only))
        return around_build(key, spec, lambda: fresh_model(self, spec, text_only))

    patch.setattr(VllmTarget, "build_model", counted_build)
    patch.setattr(VllmTarget, "fresh_model", counted_fresh)
