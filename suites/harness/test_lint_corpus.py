"""The lint's labeled corpus: findings are exactly the labels (precision and recall 100%)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from no_tensor_truthiness import RULES, check_source

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "lint" / "corpus"
FILES = sorted(CORPUS.glob("*.py"))
EXPECT = re.compile(r"# expect: (?P<codes>TB\d{3}(?:, TB\d{3})*)\s*$")


def labels(path: Path) -> tuple[Counter[tuple[int, str]], set[int]]:
    """``(line, code)`` counts that must be flagged; lines labeled ``# ok``."""
    expected: Counter[tuple[int, str]] = Counter()
    negatives = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if (m := EXPECT.search(line)) is not None:
            for code in m["codes"].split(", "):
                expected[(number, code)] += 1
        elif line.rstrip().endswith("# ok"):
            negatives.add(number)
    return expected, negatives


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_findings_are_exactly_the_labels(path):
    expected, negatives = labels(path)
    findings = check_source(path.read_text(), path.name)
    actual = Counter((f.line, f.code) for f in findings)
    missed = expected - actual
    spurious = actual - expected
    assert not missed, f"not flagged (recall): {sorted(missed)}"
    assert not spurious, f"flagged without a label (precision): {sorted(spurious)}"
    assert not {line for line, _ in actual} & negatives


def test_corpus_size_and_coverage():
    positives, negatives = 0, 0
    codes: set[str] = set()
    for path in FILES:
        expected, ok = labels(path)
        positives += sum(expected.values())
        negatives += len(ok)
        codes |= {code for _, code in expected}
    assert positives >= 60
    assert negatives >= 60
    assert codes == set(RULES) - {"TB999"}, f"rules without a case: {set(RULES) - codes}"


def test_upstream_pre_fix_pattern_is_flagged():
    source = (
        "class NemotronH_Nano_VL_V2:\n"
        "    def _parse_and_validate_image_input(self, **kwargs: object):\n"
        '        if image_embeds := kwargs.pop("image_embeds", None):\n'
        "            return image_embeds\n"
    )
    (finding,) = check_source(source, "nano_nemotron_vl.py")
    assert finding.format() == (
        "nano_nemotron_vl.py:3:12: TB009 walrus-bound tensor or None "
        '`image_embeds := kwargs.pop("image_embeds", None)` tested for truth: bind it first, '
        "then test `image_embeds is not None` (then `len()` for a list, `.numel()` for a tensor)"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "import torch\nx = torch.zeros(2)\nif x:\n    pass\n",
            "m.py:3:4: TB001 tensor `x` as `if` / `elif` condition: test `x.numel() > 0` for "
            "emptiness, or `.any()` / `.all()` for its values",
        ),
        (
            "import torch\nx = torch.zeros(2)\nassert x > 0\n",
            "m.py:3:8: TB005 tensor `x > 0` as `assert` condition: reduce it: `(x > 0).any()` or "
            "`(x > 0).all()`",
        ),
    ],
)
def test_exact_messages(source, expected):
    assert [f.format() for f in check_source(source, "m.py")] == [expected]


def test_syntax_error_is_one_finding():
    findings = check_source("def broken(:\n    pass\n", "bad.py")
    assert [(f.line, f.code) for f in findings] == [(1, "TB000")]
    assert "syntax error" in findings[0].message


@pytest.mark.parametrize("source", ["\x00", "x = '" + "(" * 300 + "'\n", "(" * 500 + ")" * 500])
def test_never_crashes(source):
    for finding in check_source(source, "odd.py"):
        assert finding.code != "TB999"


def test_the_torch_facts_the_inference_relies_on():
    """What the API tables and inference assume of torch, checked against torch itself."""
    torch = pytest.importorskip("torch")
    from no_tensor_truthiness import torch_api

    x = torch.arange(6.0).reshape(2, 3)
    # `==` / `!=` with a list, a string or None: Python answers with a bool.
    for other in ([], [0.0, 1.0, 2.0], "auto", None):
        assert type(x == other) is bool
        assert type(x != other) is bool
    assert isinstance(x == 0, torch.Tensor)
    # Tuple-returning ops give tuples of tensors; max(dim=) a named tuple with .values.
    for name in ("split", "chunk", "unbind", "sort", "topk", "aminmax"):
        assert name in torch_api.TUPLE_OF_TENSORS
    assert all(isinstance(t, torch.Tensor) for t in torch.split(x, 1))
    assert isinstance(x.max(dim=1).values, torch.Tensor)
    lo, hi = torch.aminmax(x)
    assert (lo.dim(), hi.dim()) == (0, 0)
    # 0-d constructions and full reductions.
    assert torch.tensor(float("inf")).dim() == 0
    assert torch.isnan(x.sum()).dim() == 0
    assert torch.linalg.vector_norm(x).dim() == 0
    # Methods in NON_TENSOR_METHODS return Python values.
    sparse = x.to_sparse()
    for method in ("numel", "dim", "dense_dim", "sparse_dim", "_nnz", "is_inference", "_is_view"):
        assert method in torch_api.NON_TENSOR_METHODS or method.startswith(
            torch_api.NON_TENSOR_METHOD_PREFIXES
        )
        assert not isinstance(getattr(sparse, method)(), torch.Tensor), method
    # A torch op returns a tensor whatever its argument's type was.
    assert isinstance(torch.isin(x, x), torch.Tensor)
