"""Typed input contracts, statically: typing cases checked by mypy's API (one run per target,
a cache inside the Python environment, which ``nox`` warms when it builds the shared
environment, so that no main job pays a cold mypy run over torch and vLLM; for a
``vllm-file:`` target mypy reads the files given in place of the installed modules they
replace, ``--shadow-file``). Files that must type-check (constructing
each input kind, narrowing the parse result's unions, e.g. the video parser's
pixel-or-embedding union) and files that must fail with a named mypy error code (wrong field,
wrong union member, unchecked access)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.concern("typing")

ROOT = Path(__file__).resolve().parents[2]
#: Beside the installed packages it describes: rebuilt with the environment, kept with it.
TYPING_CACHE = Path(sys.prefix) / "mypy-typing-cache"
EXPECT = re.compile(r"# expect-error: (?P<code>[a-z-]+)\s*$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


@pytest.fixture(scope="module")
def mypy_errors(target) -> dict[str, list[tuple[int, str]]]:
    """``{file name: [(line, code), ...]}`` from one mypy run over the target's cases."""
    api = pytest.importorskip("mypy.api", reason="mypy is not installed")
    folder = target.typing_cases()
    files = sorted(str(p) for p in folder.glob("*.py"))
    shadows = [str(f) for pair in target.typing_shadows() for f in ("--shadow-file", *pair)]
    stdout, stderr, _ = api.run(
        [
            *shadows,
            "--config-file",
            str(ROOT / "fixtures" / "typing" / "mypy.ini"),
            "--cache-dir",
            str(TYPING_CACHE),
            "--show-error-codes",
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            *files,
        ]
    )
    errors: dict[str, list[tuple[int, str]]] = {Path(f).name: [] for f in files}
    for line in stdout.splitlines():
        if (m := ERROR.match(line)) is not None and Path(m["path"]).name in errors:
            errors[Path(m["path"]).name].append((int(m["line"]), m["code"]))
        elif ": error:" in line:
            pytest.fail(f"mypy error outside the cases: {line}\n{stderr}")
    return errors


def expected(path: Path) -> list[tuple[int, str]]:
    return [
        (n, m["code"])
        for n, text in enumerate(path.read_text().splitlines(), start=1)
        if (m := EXPECT.search(text)) is not None
    ]


@pytest.mark.slow
def test_passing_cases_type_check(target, mypy_errors):
    cases = sorted(target.typing_cases().glob("pass_*.py"))
    assert cases, f"no pass_*.py cases in {target.typing_cases()}"
    for path in cases:
        assert mypy_errors[path.name] == [], f"{path.name}: {mypy_errors[path.name]}"


@pytest.mark.slow
def test_failing_cases_fail_with_the_named_codes(target, mypy_errors):
    cases = sorted(target.typing_cases().glob("fail_*.py"))
    assert cases, f"no fail_*.py cases in {target.typing_cases()}"
    for path in cases:
        want = expected(path)
        assert want, f"{path.name} has no expect-error lines"
        assert sorted(mypy_errors[path.name]) == sorted(want), path.name
