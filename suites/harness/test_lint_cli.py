"""The lint's command line: formats, exit status, configuration, noqa, caching, parallelism."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from no_tensor_truthiness.cli import main
from no_tensor_truthiness.config import LintConfig
from no_tensor_truthiness.runner import discover, run

ROOT = Path(__file__).resolve().parents[2]
BAD = "import torch\n\nx = torch.zeros(3)\nif x:\n    pass\n"
GOOD = "import torch\n\nx = torch.zeros(3)\nif x.numel():\n    pass\n"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(BAD)
    (tmp_path / "pkg" / "good.py").write_text(GOOD)
    (tmp_path / "pkg" / "notes.txt").write_text("if x: pass\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lint(*args, capsys):
    status = main([*args, "--no-cache"])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_text_output_and_exit_status(tree, capsys):
    status, out, _ = lint("pkg", capsys=capsys)
    assert status == 1
    assert out.splitlines() == [
        "pkg/bad.py:4:4: TB001 tensor `x` as `if` / `elif` condition: test `x.numel() > 0` for "
        "emptiness, or `.any()` / `.all()` for its values"
    ]
    status, out, _ = lint("pkg/good.py", capsys=capsys)
    assert (status, out) == (0, "")


def test_json_output(tree, capsys):
    _, out, _ = lint("pkg", "--format", "json", capsys=capsys)
    (item,) = json.loads(out)
    assert item["path"] == "pkg/bad.py"
    assert (item["line"], item["column"], item["code"]) == (4, 4, "TB001")
    assert item["fix"] == {
        "line": 4,
        "col": 3,
        "end_line": 4,
        "end_col": 4,
        "replacement": "x.numel() > 0",
        "applicability": "unsafe",
    }


def test_github_output(tree, capsys):
    _, out, _ = lint("pkg", "--format", "github", capsys=capsys)
    assert out.startswith(
        "::error file=pkg/bad.py,line=4,col=4,endLine=4,endColumn=5,"
        "title=no-tensor-truthiness TB001::tensor `x`"
    )


def test_sarif_output(tree, capsys):
    _, out, _ = lint("pkg", "--format", "sarif", capsys=capsys)
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "TB001"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (4, 4)
    rules = {r["id"]: r for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert rules.keys() >= {"TB001", "TB009"}
    assert rules["TB009"]["name"] == "tensor-in-walrus-test"
    assert "## Why is this bad?" in rules["TB009"]["help"]["markdown"]


def test_select_ignore_and_exit_zero(tree, capsys):
    assert lint("pkg", "--ignore", "TB001", capsys=capsys)[0] == 0
    assert lint("pkg", "--select", "TB002", capsys=capsys)[0] == 0
    assert lint("pkg", "--select", "TB001", capsys=capsys)[0] == 1
    assert lint("pkg", "--exit-zero", capsys=capsys)[0] == 0


def test_bad_options_exit_2(tree, capsys):
    status, _, err = lint("pkg", "--select", "TB123", capsys=capsys)
    assert status == 2
    status, _, err = lint("missing_dir", capsys=capsys)
    assert status == 2
    assert "missing_dir" in err


def test_exclude_and_include(tree, capsys):
    assert lint("pkg", "--exclude", "bad.py", capsys=capsys)[0] == 0
    assert lint("pkg", "--include", "good.py", capsys=capsys)[0] == 0


def test_pyproject_configuration(tree, capsys):
    (tree / "pyproject.toml").write_text('[tool.no-tensor-truthiness]\nexclude = ["pkg/bad.py"]\n')
    assert lint(".", capsys=capsys)[0] == 0
    (tree / "pyproject.toml").write_text('[tool.no-tensor-truthiness]\nignore = ["TB001"]\n')
    assert lint(".", capsys=capsys)[0] == 0
    (tree / "pyproject.toml").write_text('[tool.no-tensor-truthiness]\nselect = ["TB1"]\n')
    status, _, err = lint(".", capsys=capsys)
    assert status == 2
    assert "select: unknown codes ['TB1']" in err
    (tree / "pyproject.toml").write_text('[tool.no-tensor-truthiness]\nincludes = ["x"]\n')
    status, _, err = lint(".", capsys=capsys)
    assert status == 2
    assert "unknown keys ['includes']" in err


def test_noqa(tree, capsys):
    (tree / "pkg" / "bad.py").write_text(BAD.replace("if x:", "if x:  # noqa: TB001"))
    assert lint("pkg", capsys=capsys)[0] == 0
    (tree / "pkg" / "bad.py").write_text(BAD.replace("if x:", "if x:  # noqa: TB002"))
    assert lint("pkg", capsys=capsys)[0] == 1


def test_syntax_error_is_one_finding(tree, capsys):
    (tree / "pkg" / "broken.py").write_text("import torch\ndef f(:\n")
    status, out, _ = lint("pkg/broken.py", capsys=capsys)
    assert status == 1
    assert out.startswith("pkg/broken.py:2:")
    assert "TB000 syntax error, file not checked" in out


def test_cache_reuses_and_invalidates(tree):
    config = LintConfig()
    cache = tree / "cache"
    files = discover([tree / "pkg"], config)
    first = run(files, config, cache_dir=cache)
    again = run(files, config, cache_dir=cache)
    assert again.stats.cached == len(files)
    assert again.findings == first.findings
    (tree / "pkg" / "good.py").write_text(BAD)  # same size class, new content
    changed = run(files, config, cache_dir=cache)
    assert changed.stats.cached == len(files) - 1
    assert len(changed.findings) == 2


def test_parallel_equals_serial(tmp_path):
    for i in range(20):
        (tmp_path / f"m{i}.py").write_text(BAD if i % 3 == 0 else GOOD)
    files = discover([tmp_path], LintConfig())
    serial = run(files, LintConfig(), jobs=1)
    parallel = run(files, LintConfig(), jobs=2)
    assert serial.findings == parallel.findings
    assert len(serial.findings) == 7


def test_files_without_tensors_are_not_parsed(tmp_path):
    (tmp_path / "plain.py").write_text("x = [1]\nif x:\n    pass\n")
    result = run(discover([tmp_path], LintConfig()), LintConfig(), jobs=1)
    assert (result.stats.parsed, result.stats.skipped) == (0, 1)


def test_console_script_and_pre_commit_hook_agree():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["no-tensor-truthiness"] == "no_tensor_truthiness.cli:main"
    hooks = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "- id: no-tensor-truthiness" in hooks
    assert "entry: no-tensor-truthiness" in hooks
    assert "language: python" in hooks


def test_lint_imports_nothing_heavy():
    code = (
        "import sys, no_tensor_truthiness.cli; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'numpy') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_our_tree_is_clean(capsys):
    status = main(
        [str(ROOT / d) for d in ("harness", "reference_impl", "no_tensor_truthiness", "suites")]
        + ["--no-cache", "--config", str(ROOT / "pyproject.toml")]
    )
    assert status == 0, capsys.readouterr().out


def test_type_aware_mode_sees_across_modules(tmp_path):
    """A tensor returned by another module's function: invisible to the syntax, found with
    mypy's types (a minimal torch stub keeps this fast and independent of torch's stubs)."""
    pytest.importorskip("mypy")
    from no_tensor_truthiness.typeaware import type_aware_findings

    stubs = tmp_path / "stubs" / "torch"
    stubs.mkdir(parents=True)
    (stubs / "__init__.pyi").write_text("class Tensor: ...\ndef zeros(*s: int) -> Tensor: ...\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "maker.py").write_text(
        "import torch\ndef make() -> torch.Tensor:\n    return torch.zeros(2)\n"
    )
    (src / "user.py").write_text(
        "from maker import make\ndef f() -> None:\n    x = make()\n    if x:\n        pass\n"
        "    if x is not None:\n        pass\n"
    )
    user = src / "user.py"
    from no_tensor_truthiness import check_source

    assert check_source(user.read_text(), str(user)) == []
    findings = type_aware_findings(
        [user, src / "maker.py"], LintConfig(), cache_dir=None, mypy_path=[tmp_path / "stubs"]
    )
    assert [(f.line, f.code) for f in findings] == [(4, "TB001")]
    assert findings[0].message.endswith("[type-aware]")


def test_flake8_runs_the_rules_through_its_plugin_entry_point(tree):
    """``flake8 --select TB`` finds what the command line finds, at the same place (flake8 is
    installed with the test extra; the plugin comes from this package's entry point)."""

    def flake8():
        return subprocess.run(
            [sys.executable, "-m", "flake8", "--select", "TB", "pkg"],
            cwd=tree,
            capture_output=True,
            text=True,
            check=False,
        )

    found = flake8()
    assert found.returncode == 1, found.stderr
    assert found.stdout.splitlines() == [
        "pkg/bad.py:4:4: TB001 tensor `x` as `if` / `elif` condition: test `x.numel() > 0` for "
        "emptiness, or `.any()` / `.all()` for its values"
    ]
    (tree / "pkg" / "bad.py").write_text(BAD.replace("if x:", "if x:  # noqa: TB001"))
    quiet = flake8()
    assert (quiet.returncode, quiet.stdout) == (0, "")


def test_ruff_keeps_our_noqa_codes_only_with_external(tmp_path):
    """The README's advice, checked with ruff itself: its RUF100 fix strips `TB001` from a
    `noqa` that also names an unused ruff code, unless `external = ["TB"]`."""
    ruff_main = pytest.importorskip("ruff.__main__", reason="ruff is a dev tool")
    ruff = ruff_main.find_ruff_bin()
    line = "if x:  # noqa: TB001, F401\n"
    source = "import torch\nx = torch.zeros(2)\n" + line + "    pass\n"
    (tmp_path / "m.py").write_text(source)
    args = [ruff, "check", "--select", "RUF100", "--fix", "--quiet", "m.py"]
    subprocess.run([*args, "--isolated"], cwd=tmp_path, check=False)
    assert (tmp_path / "m.py").read_text().splitlines()[2] == "if x:"
    (tmp_path / "m.py").write_text(source)
    (tmp_path / "pyproject.toml").write_text('[tool.ruff.lint]\nexternal = ["TB"]\n')
    subprocess.run(args, cwd=tmp_path, check=False)
    assert (tmp_path / "m.py").read_text().splitlines()[2] == "if x:  # noqa: TB001"
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "TB" in ours["external"]
