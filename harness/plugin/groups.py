"""Check groups: one pytest process's share of a target's checks (``--check-group K/N``), and a
selection by id (``--checks-from FILE`` keeps the checks a file lists, one a line: a check's
id, a check function's for all its parameters, or a module's path for all its checks; given
twice, the checks both files list; ``--checks-not-from FILE`` drops them): the gate's two
stages, the checks that execute a change's functions first, then the rest, within a selection
of the gate's caller.

The main job spreads a target's checks over N supervised processes at once. Each collects every
check and keeps the modules of its group: whole modules, because a module's checks share its
models and fixtures, so a process builds each model its modules need once. The modules are
dealt out by :func:`assign_groups`, largest first to the group with the fewest checks so far,
which every process computes the same from the same selection. The known deviations are
applied before (every process sees every selected check's entry, so a stale entry is stale in
each).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

GROUP = re.compile(r"^(?P<index>[0-9]+)/(?P<count>[0-9]+)$")


def parse_group(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``, 1 <= K <= N; a clear error naming the option otherwise."""
    found = GROUP.match(text.strip())
    if found is None:
        raise pytest.UsageError(f"--check-group: expected K/N (e.g. 2/4), got {text!r}")
    index, count = int(found["index"]), int(found["count"])
    if not 1 <= index <= count:
        raise pytest.UsageError(
            f"--check-group: expected 1 <= K <= N, got K={index}, N={count} ({text!r})"
        )
    return index, count


def assign_groups(checks_per_module: Mapping[str, int], count: int) -> dict[str, int]:
    """Each module's group (1..count): the largest module first, each to the group with the
    fewest checks so far (the lowest-numbered on a tie); ties between modules by name."""
    load = [0] * count
    group_of: dict[str, int] = {}
    for module, checks in sorted(checks_per_module.items(), key=lambda kv: (-kv[1], kv[0])):
        group = min(range(count), key=lambda g: (load[g], g))
        group_of[module] = group + 1
        load[group] += checks
    return group_of


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemotron-vl")
    group.addoption(
        "--check-group",
        default=None,
        metavar="K/N",
        help="run the K-th of N groups of whole modules (the main job's processes per target)",
    )
    group.addoption(
        "--checks-from",
        action="append",
        default=None,
        metavar="FILE",
        help="run only the checks FILE lists (one a line: a check's id, a check function's, or a "
        "module's path); repeated, only those every FILE lists",
    )
    group.addoption(
        "--checks-not-from",
        action="append",
        default=None,
        metavar="FILE",
        help="run every check but those FILE lists (as --checks-from lists them)",
    )


def read_check_ids(option: str, path: str) -> set[str]:
    """The check ids a ``--checks-from``/``--checks-not-from`` file lists; a clear error naming
    the option and the file otherwise."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise pytest.UsageError(f"{option}: expected a file of check ids, got {path!r}: {e}") from e
    return {line.strip() for line in text.splitlines() if line.strip()}


def listed(nodeid: str, lines: set[str]) -> bool:
    """Whether ``lines`` (check ids, module paths, and check functions for all their
    parameters, as pytest's arguments name them) name the check ``nodeid``."""
    return nodeid in lines or nodeid.split("::", 1)[0] in lines or nodeid.split("[", 1)[0] in lines


def keep_listed(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Apply ``--checks-from`` and ``--checks-not-from``, deselecting the others."""
    keep = config.getoption("--checks-from") or []
    drop = config.getoption("--checks-not-from") or []
    if not keep and not drop:
        return
    wanted = [read_check_ids("--checks-from", str(path)) for path in keep]
    unwanted = [read_check_ids("--checks-not-from", str(path)) for path in drop]
    mine = [
        item
        for item in items
        if all(listed(item.nodeid, lines) for lines in wanted)
        and not any(listed(item.nodeid, lines) for lines in unwanted)
    ]
    if len(mine) != len(items):
        kept = set(mine)
        others = [item for item in items if item not in kept]
        items[:] = mine
        config.hook.pytest_deselected(items=others)


def keep_group(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the listed items (:func:`keep_listed`), then those of this process's group,
    deselecting the others. Called by the results
    plugin once every other selection (``-k``, ``-m``) is made, so that the groups share out
    what was selected, and before it counts the checks this process runs."""
    keep_listed(config, items)
    option = config.getoption("--check-group")
    if option is None:
        return
    index, count = parse_group(str(option))
    per_module: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        per_module[module] = per_module.get(module, 0) + 1
    group_of = assign_groups(per_module, count)
    mine = [item for item in items if group_of[item.nodeid.split("::", 1)[0]] == index]
    kept = set(mine)
    others = [item for item in items if item not in kept]
    if others:
        items[:] = mine
        config.hook.pytest_deselected(items=others)
