"""Annotations read into kinds, and the module pre-pass that reads the annotations of the
module's functions, classes and module-level names (:class:`Annotations`, the first layer of
:class:`~no_tensor_truthiness.inference.Inference`).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from no_tensor_truthiness.kinds import FLAGGED, Items, Kind, Note, Value, items, join_all, mapping
from no_tensor_truthiness.syntax import Imports, dotted
from no_tensor_truthiness.torch_api import MAPPING_TYPES, SEQUENCE_TYPES


class Annotations:
    """What one module's annotations say: the kinds of its functions' returns, its classes'
    attributes and methods and its annotated module-level names, and where annotated names got
    their kind."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.imports = Imports(tree)
        self.functions: dict[str, Value] = {}  # module-level functions' return values
        self.classes: dict[str, dict[str, Value]] = {}  # class -> attr / method() -> value
        self.module_env: dict[str, Value] = {}
        # Where a name, attribute or function's tensor-ness came from an annotation: "what the
        # annotation says (line N)", shown in findings so a wrong annotation is easy to spot.
        self.annotated: dict[str, Note] = {}
        self.annotated_members: dict[tuple[str, str], Note] = {}
        self.annotated_functions: dict[str, Note] = {}

    # -- annotations ---------------------------------------------------------------------

    def annotation_value(self, node: ast.expr | None) -> Value:
        """``Tensor`` -> TENSOR; ``Tensor | None``, ``Optional[Tensor]`` and unions containing a
        tensor -> OPTIONAL; ``list[Tensor]``, ``tuple[Tensor, int]``, ``dict[str, Tensor]`` (or
        None) -> Items; other annotations -> NOT_TENSOR."""
        if node is None:
            return Kind.UNKNOWN
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return Kind.UNKNOWN
        if isinstance(node, ast.Constant) and node.value is None:
            return Kind.NONE
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._union([node.left, node.right])
        if isinstance(node, ast.Subscript):
            return self._generic(node)
        parts = dotted(node)
        if parts is not None:
            if parts[-1] in self.imports.tensor_types and len(parts) == 1:
                return Kind.TENSOR
            if parts[-1] in ("Tensor", "Parameter") and parts[0] in self.imports.torch | {"nn"}:
                return Kind.TENSOR
            if len(parts) == 1 and parts[0] in self.imports.parameter:
                return Kind.TENSOR
            if len(parts) == 2 and parts[0] in self.imports.nn and parts[1] == "Parameter":
                return Kind.TENSOR
        return Kind.NOT_TENSOR

    def _generic(self, node: ast.Subscript) -> Value:
        base = dotted(node.value)
        name = base[-1] if base else ""
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if name == "Optional":
            return self._union([args[0], ast.Constant(None)])
        if name == "Union":
            return self._union(args)
        if name == "Annotated":
            return self.annotation_value(args[0])
        if name in ("tuple", "Tuple"):
            if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...:
                return items(self.element_annotation(args[0]))
            positions = tuple(self.annotation_value(a) for a in args)
            return items(join_all(positions), positions)
        if name in SEQUENCE_TYPES:
            return items(self.element_annotation(args[0]))
        if name in MAPPING_TYPES and len(args) == 2:
            return mapping(self.element_annotation(args[1]))
        return Kind.NOT_TENSOR

    def element_annotation(self, node: ast.expr) -> Value:
        """The elements of a homogeneous container. A union of a tensor with other types
        (``dict[str, Tensor | int | str]``) is a record whose keys decide the type: unknown."""
        value = self.annotation_value(node)
        if value is Kind.OPTIONAL and not self._only_tensor_or_none(node):
            return Kind.UNKNOWN
        return value

    def _only_tensor_or_none(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._only_tensor_or_none(node.left) and self._only_tensor_or_none(node.right)
        if isinstance(node, ast.Subscript):
            name = (dotted(node.value) or [""])[-1]
            args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            if name in ("Optional", "Union"):
                return all(self._only_tensor_or_none(a) for a in args)
            return False
        return self.annotation_value(node) in (Kind.TENSOR, Kind.NONE)

    def _union(self, members: Sequence[ast.expr]) -> Value:
        values = [self.annotation_value(m) for m in members]
        if any(v in FLAGGED for v in values):
            return Kind.OPTIONAL if len(values) > 1 else values[0]
        containers = [v for v in values if isinstance(v, Items)]
        # `list[Tensor] | None`: a container or None; its truth is defined, iteration is known.
        if len(containers) == 1 and all(v is Kind.NONE or v is containers[0] for v in values):
            return containers[0]
        return Kind.NOT_TENSOR

    def note(self, annotation: ast.expr, what: str) -> Note:
        return Note(what, annotation)

    # -- the module pre-pass: functions, class attributes --------------------------------

    def collect(self) -> None:
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = self.annotation_value(node.returns)
                if node.returns is not None:
                    self.annotated_functions[node.name] = self.note(
                        node.returns, f"`{node.name}()` returns"
                    )
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = self._class_members(node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.module_env[node.target.id] = self.annotation_value(node.annotation)

    def _class_members(self, cls: ast.ClassDef) -> dict[str, Value]:
        """Class-level annotations and method return values. ``self.x`` assignments and
        ``register_buffer`` calls are recorded as the methods are checked."""
        members: dict[str, Value] = {}
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                members[node.target.id] = self.annotation_value(node.annotation)
                self.annotated_members[(cls.name, node.target.id)] = self.note(
                    node.annotation, f"`self.{node.target.id}` is"
                )
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members[node.name + "()"] = self.annotation_value(node.returns)
                if node.returns is not None:
                    self.annotated_members[(cls.name, node.name + "()")] = self.note(
                        node.returns, f"`self.{node.name}()` returns"
                    )
        return members
