"""Helpers for the harness's own tests: run the suites in a child pytest process."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from harness.mutation.runner import SuiteRun
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
    """``pytest <suite...> <args>`` in a child process, with per-check results as JSON."""
    suites = (suite,) if isinstance(suite, str) else suite
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *suites,
            f"--results-json={results}",
            "-p",
            "no:cacheprovider",
            "-q",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    payload = json.loads(results.read_text()) if results.is_file() else None
    if payload is not None:
        validate(payload, RESULTS_SCHEMA)  # every results document the tests produce
    return SuiteRun(" ".join(args), proc.returncode, proc.stdout + proc.stderr, payload)


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
