"""The lint's fixes: unsafe in ruff's sense, applied only when asked, and right.

Every fixed file still parses, fixing again changes nothing, and a second lint run finds only
what had no fix. What a fix does is checked against torch itself: the upstream pattern raised
on a multi-element tensor and no longer does."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from no_tensor_truthiness import check_source
from no_tensor_truthiness.cli import main
from no_tensor_truthiness.fixes import apply_fixes, fix_source

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "lint" / "corpus"
PARSEABLE = [p for p in sorted(CORPUS.glob("*.py")) if p.name != "syntax_error.py"]

UPSTREAM = (
    "class NemotronH_Nano_VL_V2:\n"
    "    def _parse_and_validate_image_input(self, **kwargs: object):\n"
    '        if image_embeds := kwargs.pop("image_embeds", None):\n'
    "            return image_embeds\n"
    "        return None\n"
)


@pytest.mark.parametrize("path", PARSEABLE, ids=lambda p: p.name)
def test_fixed_corpus_parses_is_idempotent_and_keeps_only_the_unfixable(path):
    source = path.read_text()
    before = check_source(source, path.name)
    unfixable = Counter((f.line, f.code) for f in before if f.fix is None)
    fixed = fix_source(source, path.name)
    ast.parse(fixed.source)
    assert fixed.refused == ""
    assert fixed.applied >= sum(f.fix is not None for f in before) > 0
    assert Counter((f.line, f.code) for f in fixed.remaining) == unfixable
    again = fix_source(fixed.source, path.name)
    assert (again.source, again.applied) == (fixed.source, 0)


def test_almost_every_corpus_finding_has_a_fix():
    findings = [f for p in PARSEABLE for f in check_source(p.read_text(), p.name)]
    without = [f.format() for f in findings if f.fix is None]
    # Only `value = a or default` with `a` a tensor (its value is the result) has none.
    assert without == [
        "tb003_tb004_not_and_or.py:28:13: TB004 tensor `a` as `and` / `or` operand: test "
        "`a.numel() > 0` for emptiness, or `.any()` / `.all()` for its values (`a` is annotated "
        "`Tensor` on line 25: if it never holds a tensor, correct the annotation)"
    ]


def test_upstream_pattern_fix_keeps_the_binding_and_stops_the_crash():
    torch = pytest.importorskip("torch")
    fixed = fix_source(UPSTREAM, "nano_nemotron_vl.py")
    assert fixed.source.splitlines()[2] == (
        '        if (image_embeds := kwargs.pop("image_embeds", None)) is not None:'
    )
    assert fixed.remaining == []

    def method(source: str):  # the class's method, as torch sees it
        scope: dict[str, object] = {}
        exec(compile(source, "nano_nemotron_vl.py", "exec"), scope)
        return scope["NemotronH_Nano_VL_V2"]()._parse_and_validate_image_input  # type: ignore[operator]

    embeds = torch.zeros(2, 3, 4)
    with pytest.raises(RuntimeError, match="ambiguous"):
        method(UPSTREAM)(image_embeds=embeds)
    assert method(fixed.source)(image_embeds=embeds) is embeds
    assert method(fixed.source)() is None
    empty = torch.zeros(0, 3, 4)  # the behaviour a fix changes: an empty tensor is "there"
    assert method(fixed.source)(image_embeds=empty) is empty


@pytest.mark.parametrize(
    ("source", "fixed_line", "cases"),
    [
        (  # a tensor: emptiness
            "import torch\ndef f(t: torch.Tensor):\n    return 1 if t else 0\n",
            "    return 1 if t.numel() > 0 else 0",
            [((0,), 0), ((3,), 1)],
        ),
        (  # `not` of a tensor-or-None
            "import torch\ndef f(t: torch.Tensor | None = None):\n    return not t\n",
            "    return t is None",
            [(None, True), ((3,), False)],
        ),
        (  # an elementwise comparison: all of it
            "import torch\ndef f(t: torch.Tensor):\n    return bool(t > 0)\n",
            "    return ((t > 0).all())",
            [((2,), False)],
        ),
        (  # `x or default` of a name that may be None: the same value, without the truth test
            "import torch\ndef f(t: torch.Tensor | None = None):\n    return t or 7\n",
            "    return (t if t is not None else 7)",
            [(None, 7)],
        ),
    ],
)
def test_fixes_do_what_they_say_on_real_tensors(source, fixed_line, cases):
    torch = pytest.importorskip("torch")
    fixed = fix_source(source, "m.py")
    assert fixed.source.splitlines()[2] == fixed_line
    assert fixed.remaining == []
    scope: dict[str, object] = {}
    exec(compile(fixed.source, "m.py", "exec"), scope)
    f = scope["f"]
    for shape, expected in cases:
        argument = None if shape is None else torch.zeros(shape)
        result = f(argument)  # type: ignore[operator]
        assert bool(result == expected), (shape, result, expected)
    if "or 7" in source:  # a tensor passes through as itself
        t = torch.ones(3)
        assert f(t) is t  # type: ignore[operator]


def test_overlapping_fixes_take_two_rounds():
    source = "import torch\nt = torch.zeros(2)\nu = torch.zeros(2)\nif (t if u else t):\n    pass\n"
    fixed = fix_source(source, "m.py")
    # The source's own parentheses stay: the fix wraps what it rewrites in its own.
    assert fixed.source.splitlines()[3] == "if ((t if u.numel() > 0 else t).numel() > 0):"
    assert (fixed.applied, fixed.remaining) == (2, [])


def test_columns_count_characters_not_bytes():
    source = 'import torch\nt = torch.zeros(2)\ns = "é" if t else ""\nif t or "ü":\n    pass\n'
    fixed = fix_source(source, "m.py")
    assert fixed.source.splitlines()[2:4] == [
        's = "é" if t.numel() > 0 else ""',
        'if t.numel() > 0 or "ü":',
    ]


def test_apply_fixes_skips_overlaps_and_keeps_line_endings():
    from no_tensor_truthiness.finding import Fix

    source = "ab\r\ncd\r\n"
    text, applied = apply_fixes(source, [Fix(2, 0, 2, 1, "X"), Fix(2, 0, 2, 2, "Y")])
    assert (text, applied) == ("ab\r\nXd\r\n", 1)


BAD = "import torch\n\nx = torch.zeros(3)\nif x:\n    pass\n"


def run_cli(tmp_path, capsys, *args):
    status = main([str(tmp_path / "m.py"), "--no-cache", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_fix_alone_applies_nothing_and_says_how_many(tmp_path, capsys):
    (tmp_path / "m.py").write_text(BAD)
    status, out, err = run_cli(tmp_path, capsys, "--fix")
    assert status == 1
    assert (tmp_path / "m.py").read_text() == BAD
    assert "no fixes applied: 1 unsafe fix available" in err
    assert "TB001" in out


def test_diff_shows_without_writing(tmp_path, capsys):
    (tmp_path / "m.py").write_text(BAD)
    status, out, err = run_cli(tmp_path, capsys, "--diff", "--unsafe-fixes")
    assert status == 1
    assert (tmp_path / "m.py").read_text() == BAD
    assert "-if x:\n+if x.numel() > 0:\n" in out
    status, out, err = run_cli(tmp_path, capsys, "--diff")
    assert (status, out) == (0, "")
    assert "1 unsafe fix available" in err


def test_unsafe_fixes_write_and_a_second_run_is_clean(tmp_path, capsys):
    (tmp_path / "m.py").write_text(BAD)
    status, out, err = run_cli(tmp_path, capsys, "--fix", "--unsafe-fixes")
    assert (status, out) == (0, "")
    assert "fixed 1 findings in 1 files (0 left)" in err
    assert (tmp_path / "m.py").read_text() == BAD.replace("if x:", "if x.numel() > 0:")
    assert run_cli(tmp_path, capsys)[0] == 0


def test_without_fix_flags_the_count_of_fixable_findings_is_on_stderr(tmp_path, capsys):
    (tmp_path / "m.py").write_text(BAD)
    status, out, err = run_cli(tmp_path, capsys)
    assert status == 1
    assert "1 of 1 findings have an unsafe fix" in err
    assert out.startswith(f"{tmp_path / 'm.py'}:4:4: TB001")
