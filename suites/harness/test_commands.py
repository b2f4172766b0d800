"""Every command is a console script, so no user depends on a module path.

Each module that runs as a command (``if __name__ == "__main__":``) has an entry in
``[project.scripts]`` pointing at its ``main``, each entry names a real function, and the
documents a user reads spell commands by their script names."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib

import pytest

from suites.harness.helpers import ROOT

SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
PACKAGES = ("harness", "no_tensor_truthiness")
#: Read on machines where the harness is not installed (the GPU machine runs ``python -m``).
INSTALL_FREE = ("scripts/gpu_checks.sh",)


def command_modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__main__.py":
                continue  # ``python -m PACKAGE``: it calls a module's main, checked there
            tree = ast.parse(path.read_text())
            for node in tree.body:
                if (
                    isinstance(node, ast.If)
                    and isinstance(node.test, ast.Compare)
                    and ast.unparse(node.test) == "__name__ == '__main__'"
                ):
                    found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


@pytest.mark.parametrize("module", command_modules())
def test_every_command_module_has_a_console_script(module):
    assert f"{module}:main" in SCRIPTS.values(), f"{module} runs as a command but has no script"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_console_script_names_a_function(name):
    module, _, function = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_user_documents_spell_commands_by_their_script_names():
    documents = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "reports" / "README.md"]
    documents += sorted((ROOT / "reports" / "findings").glob("*.md"))
    documents += sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    by_module = re.compile(r"python -m (harness|no_tensor_truthiness)\b[\w.]*")
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in documents
        if path.relative_to(ROOT).as_posix() not in INSTALL_FREE
        for match in by_module.finditer(path.read_text())
    ]
    assert found == []
