"""Helpers for the harness's own tests: run the suites in a child pytest process."""

from __future__ import annotations

import functools
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_one
from harness.results import REPORT_SCHEMA, RESULTS_SCHEMA

ROOT = Path(__file__).resolve().parents[2]


def vllm_installed() -> bool:
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_vllm = pytest.mark.skipif(
    not vllm_installed(), reason="vLLM is not installed (nox -s tests installs it)"
)


def run_suites(
    tmp_path: Path, *args: str, suite: str | tuple[str, ...] = "suites/conformance"
) -> SuiteRun:
    """``pytest <suite...> <args>`` in a forked child of this process (vLLM imported once for
    the session, not once per run), with per-check results as JSON."""
    suites = (suite,) if isinstance(suite, str) else suite
    _preload_once()
    # Its files (results.json, output.log) go to tmp_path.
    run = run_one(SuiteJob(" ".join(args), None, suites, tmp_path, args))
    if run.results is not None:
        validate(run.results, RESULTS_SCHEMA)  # every results document the tests produce
    assert not run.problems, f"{run.problems}\n{run.output[-3000:]}"
    return run


@functools.cache
def _preload_once() -> None:
    preload(vllm=vllm_installed())


def validate(document: Any, schema: Path) -> None:
    """``document`` against a committed JSON Schema (``fixtures/schema/``), references between
    the schemas resolved."""
    import jsonschema
    from referencing import Registry, Resource

    resources = [
        Resource.from_contents(json.loads(path.read_text()))
        for path in (RESULTS_SCHEMA, REPORT_SCHEMA)
    ]
    registry = Registry().with_resources((r.id(), r) for r in resources)
    contents = json.loads(schema.read_text())
    jsonschema.Draft202012Validator(contents, registry=registry).validate(document)
