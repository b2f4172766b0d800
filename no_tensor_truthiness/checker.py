"""The checker: one pass over a module's statements that finds every place a truth value is
taken (each a rule of :mod:`no_tensor_truthiness.rules`) and reports those whose operand the
inference (:mod:`no_tensor_truthiness.inference`) knows to be a tensor, with the fix where one can
be written.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import replace

from no_tensor_truthiness.evaluation import DEFAULT_TENSOR_KEY
from no_tensor_truthiness.finding import Finding, Fix
from no_tensor_truthiness.inference import Inference
from no_tensor_truthiness.kinds import FLAGGED, Kind, Oracle, element_of, items, join_envs, mapping
from no_tensor_truthiness.noqa import suppressed
from no_tensor_truthiness.rules import ASSERT as ASSERT_RULE
from no_tensor_truthiness.rules import (
    BOOL_CALL,
    BOOL_OP,
    CONDITIONAL_EXPRESSION,
    FILE_NOT_CHECKED,
    IF,
    INTERNAL_ERROR,
    NOT,
    WALRUS,
    WHILE,
    message,
)
from no_tensor_truthiness.rules import COMPREHENSION_FILTER as FILTER
from no_tensor_truthiness.syntax import all_args, is_self_attr

__all__ = ["DEFAULT_TENSOR_KEY", "ModuleChecker", "check_source"]

#: Source text of an expression that may hold a nested truth context or a binding.
_NESTED_CONTEXT = re.compile(r"\b(?:and|or|not|if|bool|lambda)\b|:=")
#: Expressions a method call or a comparison can follow without parentheses.
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)


class ModuleChecker(Inference):
    """Checks one parsed module. :meth:`run` returns the findings."""

    def __init__(
        self,
        tree: ast.Module,
        source: str,
        path: str,
        tensor_key: str = DEFAULT_TENSOR_KEY,
        oracle: Oracle | None = None,
    ) -> None:
        super().__init__(tree, source, tensor_key)
        self.path = path
        self.findings: list[Finding] = []
        self.oracle = oracle  # type-aware mode: mypy's verdict where the syntax has none

    def run(self) -> list[Finding]:
        self.collect()
        self.body(self.tree.body)
        return suppressed(self.findings, self.lines)

    # -- reporting ----------------------------------------------------------------------

    def kind_or_oracle(self, node: ast.expr) -> tuple[Kind, bool]:
        """The syntactic kind; where it is unknown, the oracle's (and whether it was used)."""
        kind = self.kind(node)
        if kind is Kind.UNKNOWN and self.oracle is not None:
            typed = self.oracle(node)
            if typed is not None and typed in FLAGGED:
                return typed, True
        return kind, False

    def report(
        self,
        node: ast.expr,
        code: str,
        kind: Kind,
        typed: bool = False,
        *,
        fix: Fix | None = None,
    ) -> None:
        text = self.segment(node) or type(node).__name__
        text = " ".join(text.split())
        if len(text) > 60:
            text = text[:57] + "..."
        shown = message(code, kind, text, elementwise=isinstance(node, ast.Compare))
        origin = self.provenance(node)
        if origin is not None and not typed:
            shown += f" ({origin}: if it never holds a tensor, correct the annotation)"
        self.findings.append(
            Finding(
                self.path,
                node.lineno,
                node.col_offset + 1,
                code,
                shown + (" [type-aware]" if typed else ""),
                node.end_lineno or node.lineno,
                (node.end_col_offset or 0) + 1,
                fix,
            )
        )

    def fix_for(
        self, node: ast.expr, kind: Kind, *, replace: ast.expr | None, negated: bool, wrap: bool
    ) -> Fix | None:
        """The edit that tests ``node`` the way its kind calls for, replacing ``replace`` (the
        ``not`` or the ``bool()`` call around it) or ``node`` itself."""
        inner = self.segment(node)
        span = replace if replace is not None else node
        if inner is None or span.end_lineno is None or span.end_col_offset is None:
            return None
        operand = inner if isinstance(node, _ATOMS) else f"({inner})"
        if isinstance(node, ast.Compare):  # elementwise: the test meant every element
            test = f"not {operand}.all()" if negated else f"{operand}.all()"
        elif kind is Kind.OPTIONAL:
            test = f"{operand} is None" if negated else f"{operand} is not None"
        else:
            test = f"{operand}.numel() == 0" if negated else f"{operand}.numel() > 0"
        return Fix(
            span.lineno,
            self._char_col(span.lineno, span.col_offset),
            span.end_lineno,
            self._char_col(span.end_lineno, span.end_col_offset),
            f"({test})" if wrap else test,
        )

    def _char_col(self, line: int, byte_col: int) -> int:
        """``ast`` columns count UTF-8 bytes; fixes count characters."""
        text = self.lines[line - 1] if line <= len(self.lines) else ""
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    # -- truth contexts ------------------------------------------------------------------

    def truth(
        self,
        node: ast.expr,
        code: str,
        *,
        replace: ast.expr | None = None,
        negated: bool = False,
        fixable: bool = True,
        wrap: bool = False,
    ) -> None:
        """``node``'s truth value is taken (in a context reported as ``code``). ``replace`` is
        the expression a fix rewrites (``not node``, ``bool(node)``), ``negated`` whether that
        is a ``not``; ``fixable`` is False where the operand's value is used, not only its
        truth (``y = x or default``)."""
        if isinstance(node, ast.BoolOp):
            self.boolop(node, node.values, fixable=fixable)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.truth(node.operand, NOT, replace=node, negated=True, fixable=fixable)
            return
        if isinstance(node, ast.NamedExpr):
            self.walk(node.value)
            kind, typed = self.kind_or_oracle(node.value)
            self.bind(node.target, self.value(node.value), node.value)
            if kind in FLAGGED:
                fix = None
                if fixable:
                    fix = self.fix_for(node, kind, replace=replace, negated=negated, wrap=wrap)
                self.report(node, WALRUS, kind, typed, fix=fix)
            return
        kind, typed = self.kind_or_oracle(node)
        if kind in FLAGGED:
            fix = None
            if fixable:
                fix = self.fix_for(node, kind, replace=replace, negated=negated, wrap=wrap)
            self.report(node, code, kind, typed, fix=fix)
        self.walk(node)

    def boolop(self, node: ast.BoolOp, tested: Sequence[ast.expr], fixable: bool) -> None:
        """Truth-test ``tested`` operands (the rest are walked), each seeing what the earlier
        ones imply: in ``isinstance(x, list) and not x``, ``x`` is a list. Outside a truth
        context (``y = x or default``) an operand's value is the result: no fix, except the
        ``x or default`` of a name that may be None."""
        before = dict(self.env)
        for operand in node.values:
            if any(operand is t for t in tested):
                start = len(self.findings)
                self.truth(operand, BOOL_OP, fixable=fixable)
                if not fixable and len(self.findings) == start + 1:
                    self._fix_default(node, operand)
            else:
                self._walk(operand)
            positive, negative = self.narrowing(operand)
            changes = positive if isinstance(node.op, ast.And) else negative
            self.env = self.narrowed(self.env, changes)
        self.env = before

    def _fix_default(self, node: ast.BoolOp, operand: ast.expr) -> None:
        """``x or default`` (x a name or attribute that may be None) -> ``x if x is not None
        else default``: the same value for every x that is None or a tensor."""
        finding = self.findings[-1]
        name_like = isinstance(operand, ast.Name) or (
            isinstance(operand, ast.Attribute) and isinstance(operand.value, ast.Name)
        )
        if not (
            isinstance(node.op, ast.Or)
            and len(node.values) == 2
            and operand is node.values[0]
            and name_like
            and finding.code == BOOL_OP
            and "tensor or None" in finding.message
            and node.end_lineno is not None
            and node.end_col_offset is not None
        ):
            return
        name = self.segment(operand)
        default = self.segment(node.values[1])
        if name is None or default is None:
            return
        if not isinstance(node.values[1], _ATOMS):
            default = f"({default})"
        fix = Fix(
            node.lineno,
            self._char_col(node.lineno, node.col_offset),
            node.end_lineno,
            self._char_col(node.end_lineno, node.end_col_offset),
            f"({name} if {name} is not None else {default})",
        )
        self.findings[-1] = replace(finding, fix=fix)

    def walk(self, node: ast.AST) -> None:
        """Visit an expression's parts for nested truth contexts and bindings.

        Most expressions hold none: their source lines are tested with one regex first."""
        if isinstance(node, ast.expr) and not self._may_nest(node):
            return
        self._walk(node)

    def _may_nest(self, node: ast.expr) -> bool:
        first, last = node.lineno, node.end_lineno or node.lineno
        text = self.lines[first - 1] if first == last else "".join(self.lines[first - 1 : last])
        return _NESTED_CONTEXT.search(text) is not None

    def _walk(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            self.boolop(node, node.values[:-1], fixable=False)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.truth(node.operand, NOT, replace=node, negated=True)
        elif isinstance(node, ast.IfExp):
            self.truth(node.test, CONDITIONAL_EXPRESSION)
            positive, negative = self.narrowing(node.test)
            before = self.env
            self.env = self.narrowed(before, positive)
            self._walk(node.body)
            self.env = self.narrowed(before, negative)
            self._walk(node.orelse)
            self.env = before
        elif isinstance(node, ast.NamedExpr):
            self._walk(node.value)
            self.bind(node.target, self.value(node.value), node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "bool"
            and len(node.args) == 1
        ):
            self.truth(node.args[0], BOOL_CALL, replace=node, wrap=True)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            saved = self.scope()
            for generator in node.generators:
                self._walk(generator.iter)
                iterated = generator.iter
                self.bind_element(generator.target, element_of(self.value(iterated)), iterated)
                for condition in generator.ifs:
                    self.truth(condition, FILTER)
            if isinstance(node, ast.DictComp):
                self._walk(node.key)
                self._walk(node.value)
            else:
                self._walk(node.elt)
            self.restore(saved)
        elif isinstance(node, ast.Lambda):
            outer = self.scope()
            for arg in all_args(node.args):
                self.env[arg.arg] = Kind.UNKNOWN
            self._walk(node.body)
            self.restore(outer)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self._walk(child)

    # -- statements ---------------------------------------------------------------------

    def body(self, statements: Sequence[ast.stmt]) -> None:
        for statement in statements:
            self.stmt(statement)

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(node)
        elif isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                self.walk(decorator)
            self.class_stack.append(node.name)
            saved = dict(self.env)
            self.body(node.body)
            self.env = saved
            self.class_stack.pop()
        elif isinstance(node, ast.If):
            self.truth(node.test, IF)
            positive, negative = self.narrowing(node.test)
            before = dict(self.env)
            self.env = self.narrowed(before, positive)
            self.body(node.body)
            after_body = self.env
            self.env = self.narrowed(before, negative)
            self.body(node.orelse)
            if _always_exits(node.body):  # `if isinstance(x, Tensor): return ...`
                return  # only the else path continues
            if node.orelse and _always_exits(node.orelse):
                self.env = after_body
                return
            self.env = join_envs(after_body, self.env)
        elif isinstance(node, ast.While):
            self.truth(node.test, WHILE)
            before = dict(self.env)
            self.body(node.body)
            self.body(node.orelse)
            self.env = join_envs(before, self.env)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.walk(node.iter)
            before = dict(self.env)
            self.bind_element(node.target, element_of(self.value(node.iter)), node.iter)
            self.body(node.body)
            self.body(node.orelse)
            self.env = join_envs(before, self.env)
        elif isinstance(node, ast.Assert):
            self.truth(node.test, ASSERT_RULE)
            if node.msg is not None:
                self.walk(node.msg)
        elif isinstance(node, ast.Assign):
            self.walk(node.value)
            value = self.value(node.value)
            for target in node.targets:
                self.bind(target, value, node.value)
        elif isinstance(node, ast.AnnAssign):
            self.annotated_assignment(node)
        elif isinstance(node, ast.AugAssign):
            self.walk(node.value)
            if isinstance(node.target, ast.Name):
                kinds = {self.kind(node.target), self.kind(node.value)}
                if kinds & FLAGGED:
                    self.env[node.target.id] = Kind.TENSOR
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.walk(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, Kind.UNKNOWN, None)
            self.body(node.body)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            self.body(node.body)
            for handler in node.handlers:
                if handler.name:
                    self.env[handler.name] = Kind.NOT_TENSOR
                self.body(handler.body)
            self.body(node.orelse)
            self.body(node.finalbody)
        elif isinstance(node, ast.Expr):
            self.expression_statement(node.value)
        elif isinstance(node, ast.Match):
            self.walk(node.subject)
            for case in node.cases:
                if case.guard is not None:
                    self.truth(case.guard, IF)
                self.body(case.body)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.walk(child)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def annotated_assignment(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.walk(node.value)
        declared = self.annotation_value(node.annotation)
        if is_self_attr(node.target) and self.class_stack:
            assert isinstance(node.target, ast.Attribute)
            cls = self.class_stack[-1]
            self.classes.setdefault(cls, {})[node.target.attr] = declared
            self.annotated_members[(cls, node.target.attr)] = self.note(
                node.annotation, f"`self.{node.target.attr}` is"
            )
        if isinstance(node.target, ast.Name):
            self.bind(node.target, declared, node.value)
            self.annotated[node.target.id] = self.note(node.annotation, f"`{node.target.id}` is")

    def expression_statement(self, value: ast.expr) -> None:
        """``self.register_buffer("name", ...)`` makes ``self.name`` a tensor (0-d when the
        buffer is built 0-d: ``torch.tensor(float("inf"))``)."""
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("register_buffer", "register_parameter")
            and value.args
            and isinstance(value.args[0], ast.Constant)
            and isinstance(value.args[0].value, str)
            and self.class_stack
        ):
            members = self.classes.setdefault(self.class_stack[-1], {})
            built = self.kind(value.args[1]) if len(value.args) > 1 else Kind.TENSOR
            members.setdefault(
                value.args[0].value, Kind.SCALAR if built is Kind.SCALAR else Kind.TENSOR
            )
        self.walk(value)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.walk(decorator)
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaults: dict[str, ast.expr] = {
            a.arg: d
            for a, d in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            )
        }
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if d is not None:
                defaults[a.arg] = d
        for default_value in defaults.values():
            self.walk(default_value)
        saved, saved_notes, saved_origins = self.env, self.annotated, self.origins
        self.env, self.annotated, self.origins = dict(saved), dict(saved_notes), {}
        for arg in all_args(args):
            self.env.pop(arg.arg, None)
            self.annotated.pop(arg.arg, None)
            value = self.annotation_value(arg.annotation)
            default = defaults.get(arg.arg)
            if value is Kind.TENSOR and isinstance(default, ast.Constant) and default.value is None:
                value = Kind.OPTIONAL
            if arg is args.vararg:  # `*args: Tensor`: a tuple of tensors
                value = items(value)
            elif arg is args.kwarg:  # `**kwargs: Tensor`: a dict of tensors
                value = mapping(value)
            self.env[arg.arg] = value
            if arg.annotation is not None and value is not Kind.NOT_TENSOR:
                self.annotated[arg.arg] = self.note(arg.annotation, f"`{arg.arg}` is")
        self.body(node.body)
        self.env, self.annotated, self.origins = saved, saved_notes, saved_origins


def _always_exits(body: Sequence[ast.stmt]) -> bool:
    """The block never falls through: it ends in return, raise, continue or break."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def check_source(
    source: str, path: str, tensor_key: str = DEFAULT_TENSOR_KEY, oracle: Oracle | None = None
) -> list[Finding]:
    """All findings for one file's text. Never raises: a file that cannot be parsed is one
    ``TB000`` finding; an internal error is one ``TB999`` finding (a bug to report)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [
            Finding(
                path,
                e.lineno or 1,
                (e.offset or 1),
                FILE_NOT_CHECKED,
                f"syntax error, file not checked: {e.msg}",
            )
        ]
    except (ValueError, RecursionError, MemoryError) as e:
        return [Finding(path, 1, 1, FILE_NOT_CHECKED, f"file not checked: {type(e).__name__}: {e}")]
    try:
        return ModuleChecker(tree, source, path, tensor_key, oracle).run()
    except RecursionError:
        return [Finding(path, 1, 1, FILE_NOT_CHECKED, "file not checked: nesting too deep")]
    except Exception as e:  # a bug in the checker: one finding, never a crash
        return [Finding(path, 1, 1, INTERNAL_ERROR, f"internal error: {type(e).__name__}: {e}")]
