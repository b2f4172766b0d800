"""The import contract of the tree: the reference implementation imports neither the harness nor
the suites, the harness does not import the suites, and no two modules import each other,
directly or through others, even in ``TYPE_CHECKING`` blocks (imports inside functions are
deferred on purpose and count only for the direction rules)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from no_tensor_truthiness.syntax import (
    top_level,  # module-level statements, into if / try blocks
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference_impl", "harness", "no_tensor_truthiness", "suites")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def imported(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules an import statement loads: ``from pkg import sub`` loads ``pkg.sub`` when
    that is a module of ours, else ``pkg``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif node.module and node.level == 0:
        submodules = [f"{node.module}.{a.name}" for a in node.names]
        ours = [m for m in submodules if m in MODULES]
        yield from ours or [node.module]


def graph(everywhere: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        nodes = (
            [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
            if everywhere
            else [n for n in top_level(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom))]
        )
        edges[name] = {
            target
            for node in nodes
            for target in imported(node)
            if target.split(".")[0] in PACKAGES and target != name
        }
    return edges


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("reference_impl", ("harness", "suites", "no_tensor_truthiness")),
        ("harness", ("suites",)),
        ("no_tensor_truthiness", ("harness", "reference_impl", "suites")),
    ],
)
def test_dependencies_point_one_way(package, forbidden):
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in graph(everywhere=True).items()
        if source.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in forbidden
    )
    assert wrong == []


def test_no_import_cycles():
    edges = graph(everywhere=False)
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_contract_sees_a_cycle_and_a_wrong_direction(tmp_path, monkeypatch):
    """The checks above on a tree built to break them: they are not vacuous."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "reference_impl" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from reference_impl import b\n"
    )
    (tmp_path / "reference_impl" / "b.py").write_text(
        "from reference_impl.a import x\ndef f():\n    import harness.plugin\n"
    )
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "ROOT", tmp_path)
    monkeypatch.setattr(this, "MODULES", modules())
    with pytest.raises(AssertionError, match=r"reference_impl\.a -> reference_impl\.b"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match=r"reference_impl\.b imports harness"):
        test_dependencies_point_one_way("reference_impl", ("harness", "suites"))


PACKAGE_FOLDERS = sorted(
    path.parent.relative_to(ROOT).as_posix()
    for package in ("harness", "reference_impl", "no_tensor_truthiness")
    for path in (ROOT / package).rglob("__init__.py")
)


@pytest.mark.parametrize("package", PACKAGE_FOLDERS)
def test_each_package_docstring_names_every_module(package):
    """A newcomer's map stays whole: each package's docstring names each of its modules
    (as ``name`` or :mod:`.name`)."""
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    children = sorted(
        path.stem if path.is_file() else path.name
        for path in (ROOT / package).iterdir()
        if (path.suffix == ".py" and path.stem not in ("__init__", "__main__"))
        or (path.is_dir() and (path / "__init__.py").is_file())
    )
    missing = [
        name for name in children if f"``{name}``" not in doc and f":mod:`.{name}`" not in doc
    ]
    assert missing == []


ROOMS = sorted(
    path.name for path in (ROOT / "harness").iterdir() if (path / "__init__.py").is_file()
)


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_says_what_it_may_import(room):
    """Each room of the harness states its imports; ``lint-imports`` holds it to them (the
    layers in ``pyproject.toml``)."""
    doc = ast.get_docstring(ast.parse((ROOT / "harness" / room / "__init__.py").read_text()))
    assert doc is not None
    assert "May import:" in doc


def test_the_rooms_keep_their_layers():
    """import-linter's contracts (``[tool.importlinter]``): the rooms import downward only."""
    import shutil
    import subprocess

    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports is not None, "lint-imports is not installed (the test extra has it)"
    done = subprocess.run(
        [lint_imports, "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
