"""The lint's rules: codes defined once, each documented where users look (``rule CODE``,
``--list-rules``, the README's table, SARIF), the package split by job and importing nothing
from the rest of the harness."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from no_tensor_truthiness.cli import main
from no_tensor_truthiness.rules import RULES, rule_table

ROOT = Path(__file__).resolve().parents[2]
LINT = ROOT / "no_tensor_truthiness"


def test_every_rule_has_a_whole_page(capsys):
    for code, rule in RULES.items():
        assert main(["rule", code.lower()]) == 0
        page = capsys.readouterr().out
        assert page.startswith(f"# {rule.name} ({code})\n")
        for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert heading in page, f"{code}: no {heading!r}"
        example = page.split("## Example\n```python\n")[1].split("```")[0]
        fixed = page.split("## Use instead\n```python\n")[1].split("```")[0]
        assert example != fixed, f"{code}: the example and its fix are the same"


def test_each_truth_rule_example_is_flagged_by_that_rule_and_its_fix_is_clean():
    """The documentation's own examples run through the checker (with the names they use
    declared as tensors), so a doc cannot drift from what the rule does."""
    from no_tensor_truthiness import check_source

    prelude = (
        "import torch\n"
        "def f(ids: torch.Tensor, stop_ids: torch.Tensor, x: torch.Tensor, n: int,\n"
        "      image_embeds: torch.Tensor | None = None,\n"
        "      pixel_values: torch.Tensor | None = None,\n"
        "      audio_features: torch.Tensor | None = None,\n"
        "      embeds: torch.Tensor | None = None, kwargs: dict = {}):\n"
    )
    for code, rule in RULES.items():
        if code in ("TB000", "TB999"):
            continue

        def body(text: str) -> str:
            lines = text.strip().splitlines()
            if lines[0].startswith("def "):  # a whole function of its own
                return "import torch\n" + text
            return prelude + "".join(f"    {line}\n" for line in lines)

        flagged = {f.code for f in check_source(body(rule.example), "doc.py")}
        assert code in flagged, f"{code}'s example is not flagged by it: {flagged}"
        assert check_source(body(rule.fix), "doc.py") == [], f"{code}'s fix is still flagged"


def test_unknown_rule_exits_2_and_names_the_known_codes(capsys):
    assert main(["rule", "TB123"]) == 2
    err = capsys.readouterr().err
    assert "expected one rule code or --all, got TB123" in err
    assert "TB009" in err
    assert main(["rule"]) == 2
    assert "got nothing" in capsys.readouterr().err


def test_list_rules_and_rule_all_come_from_the_same_table(capsys):
    assert main(["--list-rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(RULES)
    assert main(["rule", "--all"]) == 0
    assert capsys.readouterr().out.count("## What it does") == len(RULES)


def test_readme_table_is_the_rendered_one():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- rules:start")[1].split("<!-- rules:end -->")[0]
    assert block.split("-->\n", 1)[1] == rule_table()


def test_codes_are_written_only_in_rules_py():
    """Rule codes are defined once: no other module of the lint has a code as a string."""
    code = re.compile(r"TB\d{3}")
    offenders = [
        f"{path.name}:{node.lineno}"
        for path in sorted(LINT.glob("*.py"))
        if path.name != "rules.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and code.fullmatch(node.value)
    ]
    assert offenders == []
    assert {"TB000", "TB999"} <= set(RULES)


@pytest.mark.parametrize("path", sorted(LINT.glob("*.py")), ids=lambda p: p.name)
def test_the_lint_imports_nothing_from_the_harness(path):
    """The lint installs and runs alone (``pip install .``, no torch): each of its modules
    imports only the standard library, its own package, and mypy/flake8 where optional."""
    allowed_third_party = {"mypy", "flake8"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top != "no_tensor_truthiness":
                import sys

                assert top in sys.stdlib_module_names or top in allowed_third_party, (
                    f"{path.name} imports {name}"
                )
