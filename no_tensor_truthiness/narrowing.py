"""Narrowing on tests: what ``isinstance``, ``is None``, ``x.numel() == 1`` and ``not`` /
``and`` / ``or`` of them tell of names inside a branch and in its ``else``, with the names
computed from a narrowed name re-derived (:class:`Narrowing`, the third layer of
:class:`~no_tensor_truthiness.inference.Inference`).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from no_tensor_truthiness.evaluation import Evaluation
from no_tensor_truthiness.kinds import Kind, Value, join_all
from no_tensor_truthiness.syntax import is_int


class Narrowing(Evaluation):
    """What a test tells of the names it reads, inside the branch it guards and outside it."""

    def __init__(self, tree: ast.Module, source: str, tensor_key: str) -> None:
        super().__init__(tree, source, tensor_key)
        self.reads: dict[int, frozenset[str]] = {}  # id(expression) -> the names it reads

    def narrowed(self, env: dict[str, Value], changes: dict[str, Value]) -> dict[str, Value]:
        """``env`` with ``changes``, and names computed from a changed name re-derived (after
        ``r = x % 2``, narrowing ``x`` to an int narrows ``r`` too)."""
        if not changes:
            return dict(env)
        saved, self.env = self.env, {**env, **changes}
        for name, origin in list(self.origins.items()):
            if (
                name not in changes
                and name in self.env
                and not self._reads(origin).isdisjoint(changes)
            ):
                self.env[name] = self.value(origin)
        result, self.env = self.env, saved
        return result

    def _either(self, changes: Sequence[dict[str, Value]]) -> dict[str, Value]:
        """What holds when one of ``changes`` does: each name joined over all of them (a name
        one of them leaves alone keeps its current value on that path)."""
        names = {name for change in changes for name in change}
        return {
            name: join_all([change.get(name, self.value(ast.Name(name))) for change in changes])
            for name in names
        }

    def _reads(self, origin: ast.expr) -> frozenset[str]:
        """The names an expression reads (computed once per expression: narrowing asks for
        the same assignments again and again)."""
        names = self.reads.get(id(origin))
        if names is None:
            names = frozenset(n.id for n in ast.walk(origin) if isinstance(n, ast.Name))
            self.reads[id(origin)] = names
        return names

    def narrowing(self, test: ast.expr) -> tuple[dict[str, Value], dict[str, Value]]:
        """Values known inside the ``if`` body and the ``else`` branch: from ``isinstance``,
        ``is None`` / ``is not None``, ``x.numel() == 1`` / ``!= 1`` (one element: its truth is
        defined), and ``not``, ``and``, ``or`` of those."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            positive, negative = self.narrowing(test.operand)
            return negative, positive
        if isinstance(test, ast.BoolOp):
            parts = [self.narrowing(operand) for operand in test.values]
            if isinstance(test.op, ast.And):  # true: every part holds; false: one does not
                return _merged([p for p, _ in parts]), self._either([n for _, n in parts])
            return self._either([p for p, _ in parts]), _merged([n for _, n in parts])
        one = _one_element_test(test)
        if one is not None:
            name, equal = one
            return ({name: Kind.SCALAR}, {}) if equal else ({}, {name: Kind.SCALAR})
        if (
            isinstance(test, ast.Call)
            and isinstance(test.func, ast.Name)
            and test.func.id == "isinstance"
            and len(test.args) == 2
            and isinstance(test.args[0], ast.Name)
        ):
            name, types = test.args[0].id, test.args[1]
            members = types.elts if isinstance(types, ast.Tuple) else [types]
            tensor = any(self.annotation_value(m) is Kind.TENSOR for m in members)
            if tensor:  # and in the else branch, whatever it is, it is not a tensor
                return {name: Kind.TENSOR}, {name: Kind.NOT_TENSOR}
            return {name: Kind.NOT_TENSOR}, {}
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.left, ast.Name)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
        ):
            name = test.left.id
            current = self.value(test.left)
            narrowed = Kind.TENSOR if current is Kind.OPTIONAL else current
            if isinstance(test.ops[0], ast.IsNot):
                return {name: narrowed}, {name: Kind.NONE}
            if isinstance(test.ops[0], ast.Is):
                return {name: Kind.NONE}, {name: narrowed}
        return {}, {}


def _merged(changes: Sequence[dict[str, Value]]) -> dict[str, Value]:
    """What every one of ``changes`` says (later ones refine earlier ones)."""
    out: dict[str, Value] = {}
    for change in changes:
        out.update(change)
    return out


def _one_element_test(test: ast.expr) -> tuple[str, bool] | None:
    """``x.numel() == 1`` -> ("x", True); ``x.numel() != 1`` -> ("x", False)."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
        and isinstance(test.left, ast.Call)
        and not test.left.args
        and isinstance(test.left.func, ast.Attribute)
        and test.left.func.attr in ("numel", "nelement")
        and isinstance(test.left.func.value, ast.Name)
        and is_int(test.comparators[0])
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 1
    ):
        return None
    return test.left.func.value.id, isinstance(test.ops[0], ast.Eq)
