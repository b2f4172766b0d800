"""The optional type-aware mode: mypy's inferred types find tensors the syntax cannot show.

The syntactic checker sees one module at a time; a tensor returned by a function of another
module, or held in an attribute typed elsewhere, is invisible to it. This mode runs mypy's build
over the files (needs ``mypy``, and ``torch`` or its stubs importable for the types), then walks
mypy's trees and reports boolean contexts whose inferred type is ``torch.Tensor`` (or a union
with one). Slow: a cold run that imports torch takes tens of seconds; mypy's cache makes reruns
fast.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from no_tensor_truthiness.checker import check_source
from no_tensor_truthiness.config import LintConfig
from no_tensor_truthiness.finding import Finding
from no_tensor_truthiness.kinds import Kind

TENSOR_NAMES = frozenset({"torch.Tensor", "torch._tensor.Tensor"})


class TypeAwareUnavailable(RuntimeError):
    """mypy is missing or could not analyse the files."""


def type_aware_findings(
    files: Sequence[Path],
    config: LintConfig,
    *,
    cache_dir: Path | None = Path(".no-tensor-truthiness-cache") / "mypy",
    mypy_path: Sequence[Path] = (),
) -> list[Finding]:
    """Findings of the syntactic checker run with mypy's types as a fallback oracle: every
    truth-tested expression the syntax cannot classify is looked up by its source span."""
    spans = tensor_spans(files, cache_dir=cache_dir, mypy_path=mypy_path)
    findings: list[Finding] = []
    for path in files:
        source = Path(path).read_text()
        findings += check_source(
            source, str(path), config.tensor_key_pattern, oracle=lambda node: _lookup(spans, node)
        )
    return sorted(f for f in set(findings) if config.enabled(f.code))


Span = tuple[int, int, int, int]
Candidates = dict[Span, list[tuple[str, str, Kind]]]


def tensor_spans(
    files: Sequence[Path], *, cache_dir: Path | None, mypy_path: Sequence[Path] = ()
) -> Candidates:
    """Every expression mypy typed as a tensor (or a union with one), by source span, with
    its node class and name so a lookup can confirm it is the same expression."""
    try:
        from mypy import build, find_sources
        from mypy.options import Options
    except ImportError as e:
        raise TypeAwareUnavailable("mypy is not installed (pip install mypy)") from e
    options = Options()
    options.incremental = cache_dir is not None
    if cache_dir is not None:
        options.cache_dir = str(cache_dir)
    options.follow_imports = "silent"
    options.ignore_missing_imports = True
    options.check_untyped_defs = True
    options.preserve_asts = True
    options.export_types = True
    options.mypy_path = [str(p) for p in mypy_path]
    try:
        sources = find_sources.create_source_list([str(f) for f in files], options)
        result = build.build(sources, options)
    except Exception as e:  # mypy's own failure: the mode cannot run
        raise TypeAwareUnavailable(f"mypy failed: {type(e).__name__}: {e}") from e
    spans: Candidates = {}
    for expr, typ in result.types.items():
        kind = tensor_kind(typ)
        if kind is Kind.NOT_TENSOR or expr.end_line is None:
            continue
        span = (expr.line, expr.column, expr.end_line, expr.end_column or 0)
        name = getattr(expr, "name", "") or ""
        spans.setdefault(span, []).append((type(expr).__name__, str(name), kind))
    return spans


# mypy expression classes and the ast classes they come from.
_SAME_NODE = {
    "NameExpr": (ast.Name,),
    "MemberExpr": (ast.Attribute,),
    "CallExpr": (ast.Call,),
    "IndexExpr": (ast.Subscript,),
    "OpExpr": (ast.BinOp, ast.BoolOp),
    "ComparisonExpr": (ast.Compare,),
    "UnaryExpr": (ast.UnaryOp,),
    "ConditionalExpr": (ast.IfExp,),
    "AssignmentExpr": (ast.NamedExpr,),
    "AwaitExpr": (ast.Await,),
}


def _lookup(spans: Candidates, node: ast.expr) -> Kind | None:
    span = (node.lineno, node.col_offset, node.end_lineno or 0, node.end_col_offset or 0)
    for cls, name, kind in spans.get(span, ()):
        if not isinstance(node, _SAME_NODE.get(cls, ())):
            continue
        own = (
            node.id
            if isinstance(node, ast.Name)
            else (node.attr if isinstance(node, ast.Attribute) else None)
        )
        if own is None or own == name:
            return kind
    return None


def tensor_kind(typ: Any) -> Kind:
    """TENSOR for a tensor type (or a subclass, e.g. ``nn.Parameter``), OPTIONAL for a union
    holding one, NOT_TENSOR otherwise."""
    from mypy.types import Instance, UnionType, get_proper_type

    proper = get_proper_type(typ)
    if isinstance(proper, Instance):
        names = {proper.type.fullname, *(base.fullname for base in proper.type.mro)}
        return Kind.TENSOR if names & TENSOR_NAMES else Kind.NOT_TENSOR
    if isinstance(proper, UnionType):
        kinds = [tensor_kind(item) for item in proper.items]
        return Kind.OPTIONAL if Kind.TENSOR in kinds else Kind.NOT_TENSOR
    return Kind.NOT_TENSOR
