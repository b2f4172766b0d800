"""Small helpers over the syntax tree: which local names are torch's (:class:`Imports`),
module-level statements, dotted names, ``self.x`` attributes, the names a target binds, a
function's arguments, int literals.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence


class Imports:
    """Which local names refer to torch, torch.nn.functional, Tensor and Parameter."""

    def __init__(self, tree: ast.Module) -> None:
        self.torch = {"torch"}
        self.functional: set[str] = set()
        self.nn: set[str] = set()
        self.tensor_types = {"Tensor"}
        self.parameter = {"Parameter"}
        for node in top_level(tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    if alias.name == "torch":
                        self.torch.add(local)
                    elif alias.name == "torch.nn.functional" and alias.asname:
                        self.functional.add(alias.asname)
                    elif alias.name == "torch.nn" and alias.asname:
                        self.nn.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if node.module == "torch" and alias.name == "Tensor":
                        self.tensor_types.add(local)
                    elif node.module == "torch" and alias.name == "nn":
                        self.nn.add(local)
                    elif node.module == "torch.nn" and alias.name == "functional":
                        self.functional.add(local)
                    elif node.module in ("torch.nn", "torch.nn.parameter") and (
                        alias.name == "Parameter"
                    ):
                        self.parameter.add(local)


def top_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking into ``if`` / ``try`` blocks (where imports hide)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from top_level(node.body)
            yield from top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from top_level(node.body)
            for handler in node.handlers:
                yield from top_level(handler.body)
            yield from top_level(node.orelse)


def dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def is_self_attr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def bound_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def all_args(args: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def is_int(node: ast.expr) -> bool:
    """An int literal, possibly negated (``1``, ``-1``; not ``True``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int
