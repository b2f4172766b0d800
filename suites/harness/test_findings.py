"""The reproductions under ``reports/findings/``: each still reproduces its finding on the
installed vLLM, and each is cited by the known deviation it reproduces."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from harness.deviations import deviations_path, load_deviations
from suites.harness.helpers import ROOT

FINDINGS = ROOT / "reports" / "findings"
SCRIPTS = sorted(p for p in FINDINGS.glob("*.py") if not p.name.startswith("_"))

DRIVER = """
import runpy, sys
sys.path.insert(0, {folder!r})
for path in sys.argv[1:]:
    print(path, "rc", runpy.run_path(path, run_name="finding")["main"](), flush=True)
"""


def test_every_reproduction_is_cited_by_a_deviation():
    reasons = " ".join(d.reason for d in load_deviations(deviations_path("vllm")).values())
    assert SCRIPTS, "no reproductions under reports/findings"
    uncited = [p.name for p in SCRIPTS if f"reports/findings/{p.name}" not in reasons]
    assert not uncited, f"reproductions no deviation cites: {uncited}"


def test_every_reproduction_reproduces():
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pytest.skip("vLLM is not installed: the reproductions run against it")
    driver = DRIVER.format(folder=str(FINDINGS))
    done = subprocess.run(
        [sys.executable, "-c", driver, *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = dict(line.split(" rc ") for line in done.stdout.splitlines() if " rc " in line)
    assert set(codes) == set(map(str, SCRIPTS)), done.stdout
    fixed = [p for p, rc in codes.items() if rc != "0"]
    assert not fixed, f"no longer reproduced (fixed upstream? update the deviations): {fixed}"
