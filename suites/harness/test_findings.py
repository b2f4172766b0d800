"""The reproductions under ``reports/findings/``: each still reproduces its finding on the
installed vLLM, and each is cited by the known deviation it reproduces."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from harness import findings
from harness.deviations import deviations_path, load_deviations

SCRIPTS = findings.scripts()


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
    runs = findings.run_all(SCRIPTS, timeout_s=600)
    assert [run.name for run in runs] == [p.stem for p in SCRIPTS]
    broken = [(run.name, run.said) for run in runs if run.status == findings.Status.BROKEN]
    assert not broken, f"reproductions that failed to run: {broken}"
    fixed = [run.name for run in runs if run.status == findings.Status.FIXED]
    assert not fixed, f"no longer reproduced (fixed upstream? update the deviations): {fixed}"


def test_the_table_says_reproduced_fixed_or_broken():
    """The driver's fenced output (hand-written here) read back, and the exit status."""
    paths = [Path("/r/a.py"), Path("/r/b.py"), Path("/r/c.py"), Path("/r/d.py")]
    output = "\n".join(
        [
            f"{findings.START}/r/a.py",
            "noise",
            "REPRODUCED: ValueError: bad",
            "  its message running on",
            f"{findings.END}/r/a.py 0",
            f"{findings.START}/r/b.py",
            "NOT REPRODUCED: the request was processed",
            f"{findings.END}/r/b.py 1",
            f"{findings.START}/r/c.py",
            "Traceback ...",
            "KeyError: 'x'",
            f"{findings.END}/r/c.py error:KeyError",
            f"{findings.START}/r/d.py",
        ]
    )
    runs = findings.parse(output, paths)
    assert [(r.name, r.status, r.said) for r in runs] == [
        ("a", findings.Status.REPRODUCED, "REPRODUCED: ValueError: bad"),
        ("b", findings.Status.FIXED, "NOT REPRODUCED: the request was processed"),
        ("c", findings.Status.BROKEN, "KeyError: 'x'"),
        ("d", findings.Status.BROKEN, "(no output: the run stopped before this script ended)"),
    ]
    table = findings.render(runs, "0.33.0")
    assert (
        "| `reports/findings/b.py` | fixed | NOT REPRODUCED: the request was processed |" in table
    )
    assert findings.exit_status(runs) == 2
    assert findings.exit_status(runs[:2]) == 1
    assert findings.exit_status(runs[:1]) == 0
