"""First-order mutants of the functions of vLLM's model files, from their syntax trees.

The functions are those of the mutation score's scope (:mod:`harness.mutation.reach`, which also
measures which checks execute each line). :func:`enumerate_mutants` walks one function's body and
makes one mutant per applicable operator and site; each replaces exactly the source span of one
node, so the rest of the file stays byte for byte what is installed. The operators (named as in
mutmut and cosmic-ray):

- ``arithmetic``: ``+`` and ``-`` swapped, ``*`` and ``/`` swapped, ``//`` and ``%`` to ``*``;
- ``comparison``: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``is`` and ``is not``,
  ``in`` and ``not in`` swapped;
- ``boolean``: ``and`` and ``or`` swapped;
- ``not-removed``: ``not x`` becomes ``x``;
- ``constant``: an integer ``n`` becomes ``n + 1`` and, when not 0, ``0``; ``True`` and
  ``False`` swapped;
- ``condition-negated``: the test of an ``if``, ``while`` or conditional expression becomes
  ``not (test)``;
- ``statement-removed``: a call statement, an augmented assignment, an assignment or a
  ``raise`` becomes ``pass``; ``return x`` becomes ``return None``.

Skipped as trivially equivalent or meaningless: docstrings, annotations, the insides of
f-strings, ``assert`` messages and logging calls. A mutant whose text does not parse is dropped
and counted. :func:`sample` draws a seeded sample stratified by function.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.model_files import installed_file, write_mutated_copy
from harness.mutation.reach import ScopeFunction, functions_in_scope


class FunctionNotFound(LookupError):
    """A covered function is not in the installed file (renamed or removed upstream)."""


@dataclass(frozen=True)
class AstMutant:
    """One first-order mutant: the span ``[start, end)`` of the file's text replaced."""

    file: Path
    qualname: str
    line: int
    col: int
    operator: str
    index: int  # among the mutants of one operator at one site
    start: int
    end: int
    replacement: str
    original: str
    statement_line: int  # the first line of the innermost statement holding the site

    @property
    def id(self) -> str:
        where = f"{self.file.parent.name}/{self.file.stem}:{self.qualname}"
        return f"{where}:{self.line}:{self.col}:{self.operator}:{self.index}"

    @property
    def description(self) -> str:
        before = " ".join(self.original.split())[:60]
        after = " ".join(self.replacement.split())[:60]
        return f"line {self.line}: `{before}` -> `{after}` ({self.operator})"

    def apply(self, source: str) -> str:
        if source[self.start : self.end] != self.original:
            raise ValueError(f"mutant {self.id}: the file's text at its span changed")
        return source[: self.start] + self.replacement + source[self.end :]


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        for node in body:
            if last and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name == part:
                    return node
            elif not last and isinstance(node, ast.ClassDef) and node.name == part:
                body = node.body
                break
        else:
            break
    raise FunctionNotFound(f"{qualname}: no such function")


class _Offsets:
    """Character offsets of ``ast`` positions (whose columns count UTF-8 bytes)."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col_bytes: int) -> int:
        text = self.lines[line - 1]
        return self.starts[line - 1] + len(text.encode()[:col_bytes].decode(errors="ignore"))

    def span(self, node: ast.expr | ast.stmt) -> tuple[int, int]:
        end_line = node.end_lineno if node.end_lineno is not None else node.lineno
        end_col = node.end_col_offset if node.end_col_offset is not None else node.col_offset
        return self.at(node.lineno, node.col_offset), self.at(end_line, end_col)


ARITHMETIC = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "*"),
}
COMPARISON = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes (by id) whose insides no mutant touches: docstrings, annotations, f-strings,
    assert messages, logging calls."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first)
            if not isinstance(node, ast.ClassDef):
                mark(node.returns)
                for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Assert):
            mark(node.msg)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("logger", "logging", "warnings")
        ):
            mark(node)
    return skip


def _sites(
    function: ast.FunctionDef | ast.AsyncFunctionDef, source: str, offsets: _Offsets
) -> Iterator[tuple[ast.expr | ast.stmt, str, int, int, str]]:
    """(node, operator, start, end, replacement) for every applicable mutation."""
    skip = _skipped(function)
    body = [
        node
        for statement in function.body
        for node in ast.walk(statement)
        if isinstance(node, ast.stmt | ast.expr)  # the nodes with a position
    ]
    for node in sorted(body, key=lambda n: (n.lineno, n.col_offset)):
        if id(node) in skip or (isinstance(node, ast.Expr) and id(node.value) in skip):
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            symbol, swapped = ARITHMETIC[type(node.op)]
            gap_start = offsets.span(node.left)[1]
            gap_end = offsets.span(node.right)[0]
            gap = source[gap_start:gap_end]
            at = gap.find(symbol)
            if at >= 0 and (symbol != "/" or gap[at : at + 2] != "//"):
                yield node, "arithmetic", gap_start + at, gap_start + at + len(symbol), swapped
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            symbol, swapped = COMPARISON[type(node.ops[0])]
            gap_start = offsets.span(node.left)[1]
            gap_end = offsets.span(node.comparators[0])[0]
            gap = source[gap_start:gap_end]
            stripped = " ".join(gap.split())
            if stripped == symbol:
                yield node, "comparison", gap_start, gap_end, f" {swapped} "
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            gap_start = offsets.span(node.values[0])[1]
            gap_end = offsets.span(node.values[1])[0]
            word = "and" if isinstance(node.op, ast.And) else "or"
            if " ".join(source[gap_start:gap_end].split()) == word:
                swapped = "or" if word == "and" else "and"
                yield node, "boolean", gap_start, gap_end, f" {swapped} "
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            start, end = offsets.span(node)
            operand_start, operand_end = offsets.span(node.operand)
            yield node, "not-removed", start, end, source[operand_start:operand_end]
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, "constant", *offsets.span(node), str(not node.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            start, end = offsets.span(node)
            yield node, "constant", start, end, str(node.value + 1)
            if node.value != 0:
                yield node, "constant", start, end, "0"
        if isinstance(node, ast.If | ast.While | ast.IfExp) and id(node.test) not in skip:
            start, end = offsets.span(node.test)
            yield node, "condition-negated", start, end, f"not ({source[start:end]})"
        removable = isinstance(node, ast.AugAssign | ast.Assign | ast.Raise) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        )
        if removable:
            yield node, "statement-removed", *offsets.span(node), "pass"
        elif (
            isinstance(node, ast.Return)
            and node.value is not None
            and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):
            yield node, "statement-removed", *offsets.span(node), "return None"


@dataclass(frozen=True)
class Enumeration:
    mutants: list[AstMutant]
    unparseable: int  # mutants dropped because their text does not parse


def _statement_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[int, int]:
    """The first line of the innermost statement holding each node of ``function``'s body, by
    node id (coverage.py records a statement's lines, not an expression's)."""
    lines: dict[int, int] = {}
    # ast.walk goes outside in: an inner statement's line overwrites its outer statement's.
    for statement in (n for n in ast.walk(function) if isinstance(n, ast.stmt)):
        for node in ast.walk(statement):
            lines[id(node)] = statement.lineno
    return lines


def enumerate_mutants(source: str, file: Path, qualname: str) -> Enumeration:
    """Every first-order mutant of function ``qualname`` in ``source`` (the text of ``file``)."""
    tree = ast.parse(source)
    function = find_function(tree, qualname)
    offsets = _Offsets(source)
    statement_of = _statement_lines(function)
    parses = _function_parser(source, function, offsets)
    mutants: list[AstMutant] = []
    unparseable = 0
    seen: dict[tuple[int, int, str], int] = {}
    for node, operator, start, end, replacement in _sites(function, source, offsets):
        line, col = node.lineno, node.col_offset
        index = seen.get((line, col, operator), 0)
        seen[line, col, operator] = index + 1
        mutant = AstMutant(
            file,
            qualname,
            line,
            col,
            operator,
            index,
            start,
            end,
            replacement,
            source[start:end],
            statement_of.get(id(node), line),
        )
        if not parses(mutant):
            unparseable += 1
            continue
        mutants.append(mutant)
    return Enumeration(mutants, unparseable)


def _function_parser(
    source: str, function: ast.FunctionDef | ast.AsyncFunctionDef, offsets: _Offsets
) -> Callable[[AstMutant], bool]:
    """Whether a mutant of ``function`` leaves ``source`` parseable, found by parsing the
    function's own text with the mutant applied (its lines, decorators included, under an
    ``if 1:`` when indented), not the whole file: a change inside a function can break the
    syntax of that function's text only, and the file's parse per mutant took 19 s of the
    21 s ``candidates`` took."""
    first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
    last = function.end_lineno if function.end_lineno is not None else function.lineno
    begin, finish = offsets.starts[first - 1], offsets.starts[last]
    prefix = "if 1:\n" if function.col_offset else ""

    def parses(mutant: AstMutant) -> bool:
        if not begin <= mutant.start <= mutant.end <= finish:
            raise ValueError(f"mutant {mutant.id}: its span is outside its function's lines")
        text = source[begin : mutant.start] + mutant.replacement + source[mutant.end : finish]
        try:
            ast.parse(prefix + text)
        except SyntaxError:
            return False
        return True

    return parses


def candidates(functions: list[ScopeFunction] | None = None) -> list[AstMutant]:
    """Every mutant of every function of the scope (default: :func:`functions_in_scope` of the
    installed vLLM)."""
    out: list[AstMutant] = []
    sources: dict[Path, str] = {}
    for function in functions_in_scope() if functions is None else functions:
        if function.file not in sources:
            sources[function.file] = installed_file(function.file).read_text()
        out += enumerate_mutants(sources[function.file], function.file, function.qualname).mutants
    return out


def sample(mutants: list[AstMutant], n: int, seed: int) -> list[AstMutant]:
    """``n`` mutants (all when fewer), stratified by function: each function gets a share
    proportional to its mutants and at least one; the rest are drawn at random. Sorted by id;
    the same ``mutants``, ``n`` and ``seed`` give the same sample."""
    ordered = sorted(mutants, key=lambda m: m.id)
    if n >= len(ordered):
        return ordered
    rng = random.Random(seed)
    by_function: dict[tuple[Path, str], list[AstMutant]] = {}
    for mutant in ordered:
        by_function.setdefault((mutant.file, mutant.qualname), []).append(mutant)
    chosen: list[AstMutant] = []
    for group in by_function.values():
        share = max(1, len(group) * n // len(ordered))
        chosen += rng.sample(group, min(share, len(group)))
    taken = {m.id for m in chosen}
    if len(chosen) < n:
        chosen += rng.sample([m for m in ordered if m.id not in taken], n - len(chosen))
    while len(chosen) > n:  # the floors of one overshot: drop from functions with several
        counts: dict[tuple[Path, str], int] = {}
        for m in chosen:
            counts[m.file, m.qualname] = counts.get((m.file, m.qualname), 0) + 1
        droppable = [i for i, m in enumerate(chosen) if counts[m.file, m.qualname] > 1] or list(
            range(len(chosen))
        )
        chosen.pop(rng.choice(droppable))
    return sorted(chosen, key=lambda m: m.id)


def write_mutant_file(mutant: AstMutant, dest_dir: Path) -> Path:
    """The mutated copy of the installed file at ``dest_dir / mutant.file`` (the installed file
    is never edited); its path, for ``--target=vllm-file:PATH``."""
    return write_mutated_copy(mutant.file, dest_dir, mutant.apply)
