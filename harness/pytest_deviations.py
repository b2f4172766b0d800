"""Apply the target's known deviations (``fixtures/deviations/<target>.toml``) as strict xfails."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.deviations import Deviation, DeviationFileError, deviations_path, load_deviations
from harness.pytest_target import current_target

DEVIATIONS_KEY = pytest.StashKey[dict[str, Deviation]]()
APPLIED_KEY = pytest.StashKey[set[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nemotron-vl").addoption(
        "--deviations",
        default=None,
        metavar="PATH",
        help="known-deviation file to apply instead of fixtures/deviations/<target>.toml",
    )


def pytest_configure(config: pytest.Config) -> None:
    option = config.getoption("--deviations")
    path = Path(option) if option else deviations_path(current_target(config).deviations_name)
    if option and not path.is_file():
        pytest.exit(f"harness could not run: --deviations: {path}: no such file", returncode=2)
    try:
        config.stash[DEVIATIONS_KEY] = load_deviations(path)
    except DeviationFileError as e:
        pytest.exit(f"harness could not run: {e}", returncode=2)
    config.stash[APPLIED_KEY] = set()


def is_check(item: pytest.Item) -> bool:
    """A conformance check is a test that runs against the target."""
    return "target" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deviations = config.stash[DEVIATIONS_KEY]
    applied = config.stash[APPLIED_KEY]
    for item in items:
        deviation = deviations.get(item.nodeid)
        if deviation is not None and is_check(item):
            item.add_marker(pytest.mark.xfail(reason=deviation.reason, strict=True))
            applied.add(item.nodeid)


def stale_deviations(config: pytest.Config) -> list[str]:
    """Entries that matched no collected check (renamed or removed checks)."""
    listed: dict[str, Deviation] = config.stash[DEVIATIONS_KEY]
    applied: set[str] = config.stash[APPLIED_KEY]
    return sorted(set(listed) - applied)
