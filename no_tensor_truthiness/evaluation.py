"""Expression evaluation: what an expression holds given the names bound so far (torch calls,
tensor methods, containers, arithmetic, comprehensions), the bindings that change it
(assignments, unpacking, ``for`` and comprehension targets, ``self.x = ...``), and which
annotation made a value a tensor (:class:`Evaluation`, the second layer of
:class:`~no_tensor_truthiness.inference.Inference`).
"""

from __future__ import annotations

import ast
import re

from no_tensor_truthiness.annotations import Annotations
from no_tensor_truthiness.kinds import (
    FLAGGED,
    Items,
    Kind,
    Note,
    Value,
    element_of,
    informative,
    items,
    join,
    join_all,
    mapping,
    truth_kind,
)
from no_tensor_truthiness.syntax import bound_names, dotted, is_int, is_self_attr
from no_tensor_truthiness.torch_api import (
    DIM_TUPLE_REDUCTIONS,
    ELEMENT_PRESERVING_BUILTINS,
    LINALG_NORMS,
    NAMED_TUPLE_TENSOR_FIELDS,
    NON_TENSOR_ATTRS,
    NON_TENSOR_BUILTINS,
    NON_TENSOR_METHOD_PREFIXES,
    NON_TENSOR_METHODS,
    NUMEL_CHANGING,
    TENSOR_ATTRS,
    TORCH_CONSTRUCTORS,
    TORCH_REDUCTIONS,
    TORCH_SCALAR_CONSTRUCTORS,
    TORCH_TENSOR_FUNCS,
    TUPLE_OF_TENSORS,
    TUPLE_WHEN_ASKED,
)

#: Multimodal input keys whose values are tensors, lists of tensors or None.
DEFAULT_TENSOR_KEY = (
    r"^pixel_values|_embeds$|_attention_mask$"
    r"|^(image|video|audio|vision|visual|mm|multimodal|speech|sound|input_audio|input)"
    r"_(embeddings|features)$"
)


class Evaluation(Annotations):
    """What one module's expressions hold: the environment of the scope being checked (names,
    and the expressions last assigned to them) and the class whose method is being checked."""

    def __init__(self, tree: ast.Module, source: str, tensor_key: str) -> None:
        super().__init__(tree)
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.key_pattern = re.compile(tensor_key)
        self.class_stack: list[str] = []
        self.env: dict[str, Value] = {}
        self.origins: dict[str, ast.expr] = {}  # name -> the expression last assigned to it

    # -- expressions ---------------------------------------------------------------------

    def kind(self, node: ast.expr) -> Kind:
        """What ``node``'s truth value means."""
        return truth_kind(self.value(node))

    def value(self, node: ast.expr) -> Value:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, self.module_env.get(node.id, Kind.UNKNOWN))
        if isinstance(node, ast.Constant):
            return Kind.NONE if node.value is None else Kind.NOT_TENSOR
        if isinstance(node, ast.NamedExpr):
            return self.value(node.value)
        if isinstance(node, ast.Call):
            return self.call_value(node)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(left, Items) and left == right:  # `xs + ys`: list concatenation
                return left
            sides = {truth_kind(left), truth_kind(right)}
            if sides & FLAGGED:
                return Kind.TENSOR
            return Kind.SCALAR if Kind.SCALAR in sides else Kind.UNKNOWN
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return Kind.NOT_TENSOR
            inner = self.kind(node.operand)
            return Kind.TENSOR if inner in FLAGGED else inner
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return Kind.NOT_TENSOR
            if _compares_with_a_non_number(node):
                return Kind.NOT_TENSOR
            sides = {self.kind(node.left), *(self.kind(c) for c in node.comparators)}
            if sides & FLAGGED:
                return Kind.TENSOR
            return Kind.SCALAR if Kind.SCALAR in sides else Kind.NOT_TENSOR
        if isinstance(node, ast.IfExp):
            return join(self.value(node.body), self.value(node.orelse))
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, (ast.List, ast.Set)):
            if not node.elts or any(isinstance(e, ast.Starred) for e in node.elts):
                return Kind.NOT_TENSOR
            return items(join_all([self.value(e) for e in node.elts]))
        if isinstance(node, ast.Tuple):
            if not node.elts or any(isinstance(e, ast.Starred) for e in node.elts):
                return Kind.NOT_TENSOR
            positions = tuple(self.value(e) for e in node.elts)
            return items(join_all(positions), positions)
        if isinstance(node, ast.Dict):
            values = [self.value(v) for k, v in zip(node.keys, node.values, strict=True) if k]
            return mapping(join_all(values)) if values else Kind.NOT_TENSOR
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return items(self.comprehension_element(node.generators, node.elt))
        if isinstance(node, ast.DictComp):
            return mapping(self.comprehension_element(node.generators, node.value))
        if isinstance(node, ast.JoinedStr):
            return Kind.NOT_TENSOR
        return Kind.UNKNOWN

    def _attribute(self, node: ast.Attribute) -> Value:
        if is_self_attr(node) and self.class_stack:
            return self.classes.get(self.class_stack[-1], {}).get(node.attr, Kind.UNKNOWN)
        base = self.value(node.value)
        if isinstance(base, Items):
            # The named tuples of `max(dim=)`, `sort`, `topk`: `.values`, `.indices`.
            if node.attr in NAMED_TUPLE_TENSOR_FIELDS and base.element is Kind.TENSOR:
                return Kind.TENSOR
            return Kind.UNKNOWN
        if base in FLAGGED:
            if node.attr in TENSOR_ATTRS:
                return Kind.TENSOR
            return Kind.NOT_TENSOR if node.attr in NON_TENSOR_ATTRS else Kind.UNKNOWN
        return Kind.UNKNOWN

    def _subscript(self, node: ast.Subscript) -> Value:
        key = node.slice
        if (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and self.key_pattern.search(key.value)
        ):
            return Kind.OPTIONAL
        base = self.value(node.value)
        if not isinstance(base, Items):
            return Kind.UNKNOWN
        if base.mapping:
            return base.element
        if isinstance(key, ast.Slice):
            return Items(base.element)
        if base.positions is not None and isinstance(key, ast.Constant):
            index = key.value
            if isinstance(index, int) and -len(base.positions) <= index < len(base.positions):
                return base.positions[index]
        return base.element

    def comprehension_element(self, generators: list[ast.comprehension], elt: ast.expr) -> Value:
        """The value of a comprehension's element, with its targets bound."""
        saved = self.scope()
        try:
            for generator in generators:
                iterated = generator.iter
                self.bind_element(generator.target, element_of(self.value(iterated)), iterated)
            return self.value(elt)
        finally:
            self.restore(saved)

    def scope(self) -> tuple[dict[str, Value], dict[str, Note], dict[str, ast.expr]]:
        """A copy of what a nested scope (a comprehension, a lambda) may change."""
        return dict(self.env), dict(self.annotated), dict(self.origins)

    def restore(self, saved: tuple[dict[str, Value], dict[str, Note], dict[str, ast.expr]]) -> None:
        self.env, self.annotated, self.origins = saved

    def call_value(self, node: ast.Call) -> Value:
        func = node.func
        parts = dotted(func)
        if parts is not None:
            head, name = parts[0], parts[-1]
            if len(parts) == 2 and head in self.imports.torch:
                return self._torch_call(node, name)
            if len(parts) == 3 and head in self.imports.torch and parts[1] == "linalg":
                if name in LINALG_NORMS:
                    return Kind.SCALAR if _no_dim(node, positional=2) else Kind.TENSOR
                return Kind.UNKNOWN
            if (
                len(parts) == 4
                and head in self.imports.torch
                and parts[1:3] == ["nn", "functional"]
            ) or (len(parts) == 2 and head in self.imports.functional):
                return self._shaped_by_argument(node, keeps_numel=True)
            if (
                parts in (["nn", "Parameter"], ["torch", "nn", "Parameter"])
                or (len(parts) == 1 and head in self.imports.parameter)
                or (len(parts) == 2 and head in self.imports.nn and name == "Parameter")
            ):
                return Kind.TENSOR
            if len(parts) == 1:
                return self._builtin_or_function(node, head)
            if len(parts) == 2 and head == "self" and self.class_stack:
                members = self.classes.get(self.class_stack[-1], {})
                if name + "()" in members:
                    return members[name + "()"]
        if isinstance(func, ast.Attribute):
            return self._method_call(node, func)
        return Kind.UNKNOWN

    def _builtin_or_function(self, node: ast.Call, name: str) -> Value:
        if name in NON_TENSOR_BUILTINS:
            return Kind.NOT_TENSOR
        if name in ELEMENT_PRESERVING_BUILTINS:
            if len(node.args) != 1:
                return Kind.NOT_TENSOR
            return items(element_of(self.value(node.args[0])))
        if name == "enumerate" and node.args:
            return items(items(Kind.UNKNOWN, (Kind.NOT_TENSOR, self._element(node.args[0]))))
        if name == "zip" and node.args:
            if any(isinstance(a, ast.Starred) for a in node.args):
                return Kind.NOT_TENSOR
            positions = tuple(self._element(a) for a in node.args)
            return items(items(join_all(positions), positions))
        return self.functions.get(name, Kind.UNKNOWN)

    def _element(self, node: ast.expr) -> Value:
        return element_of(self.value(node))

    def _torch_call(self, node: ast.Call, name: str) -> Value:
        if name in TORCH_SCALAR_CONSTRUCTORS and _scalar_construction(node, name):
            return Kind.SCALAR
        if name == "aminmax":  # (min, max): 0-d each without a dim
            return Items(Kind.SCALAR if _no_dim(node, positional=1) else Kind.TENSOR)
        if name in TUPLE_OF_TENSORS or _asks_for_tuple(node, name):
            return Items(Kind.TENSOR)
        if name in TORCH_REDUCTIONS:
            if _no_dim(node, positional=1):
                return Kind.SCALAR
            if name in DIM_TUPLE_REDUCTIONS:
                second = node.args[1] if len(node.args) > 1 else None
                if second is None or is_int(second):  # dim=, or a literal dim
                    return Items(Kind.TENSOR)
                if self.kind(second) in FLAGGED:  # torch.max(a, b): elementwise
                    return Kind.TENSOR
                return Kind.UNKNOWN  # torch.max(x, dim_variable) or elementwise: unknown
            return Kind.TENSOR
        if name == "where" and len(node.args) == 1 and not node.keywords:
            return Items(Kind.TENSOR)
        if name in TORCH_CONSTRUCTORS:
            return Kind.TENSOR
        if name in TORCH_TENSOR_FUNCS:
            return self._shaped_by_argument(node, keeps_numel=name not in NUMEL_CHANGING)
        return Kind.NOT_TENSOR

    def _shaped_by_argument(self, node: ast.Call, keeps_numel: bool) -> Kind:
        """An op that returns a tensor whatever its argument: a 0-d tensor only when its first
        argument is known 0-d and the op keeps the number of elements
        (``torch.isnan(loss.sum())``)."""
        if keeps_numel and node.args and self.kind(node.args[0]) is Kind.SCALAR:
            return Kind.SCALAR
        return Kind.TENSOR

    def _method_call(self, node: ast.Call, func: ast.Attribute) -> Value:
        receiver = self.value(func.value)
        if isinstance(receiver, Items):
            return self._container_method(node, func.attr, receiver)
        if func.attr in ("pop", "get") and node.args:
            key = node.args[0]
            default = node.args[1] if len(node.args) > 1 else None
            plain_default = isinstance(default, ast.Constant) and default.value is not None
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and self.key_pattern.search(key.value)
                and not plain_default  # pop("x_embeds", False): a flag, not an input
            ):
                return Kind.OPTIONAL
        if receiver in FLAGGED or receiver is Kind.SCALAR:
            method = func.attr
            if method in NON_TENSOR_METHODS or method.startswith(NON_TENSOR_METHOD_PREFIXES):
                return Kind.NOT_TENSOR
            if method == "aminmax":
                return Items(Kind.SCALAR if _no_dim(node, positional=0) else Kind.TENSOR)
            if method in TUPLE_OF_TENSORS or _asks_for_tuple(node, method):
                return Items(Kind.TENSOR)
            if method in TORCH_REDUCTIONS and _no_dim(node, positional=0):
                return Kind.SCALAR
            if method in DIM_TUPLE_REDUCTIONS:
                first = node.args[0] if node.args else None
                if first is None or is_int(first):
                    return Items(Kind.TENSOR)
                return Kind.TENSOR if self.kind(first) in FLAGGED else Kind.UNKNOWN
            return Kind.SCALAR if receiver is Kind.SCALAR else Kind.TENSOR
        if receiver is Kind.UNKNOWN and func.attr in TORCH_REDUCTIONS and _no_dim(node, 0):
            # `loss.sum()`: 0-d if `loss` is a tensor (and no tensor at all otherwise).
            return Kind.SCALAR
        return Kind.UNKNOWN

    def _container_method(self, node: ast.Call, method: str, container: Items) -> Value:
        """``d.values()``, ``d.items()``, ``d.get(k)``, ``d.pop(k)``, ``xs.pop()``, ``xs.copy()``
        on a container whose elements are known."""
        if container.mapping:
            if method == "values":
                return items(container.element)
            if method == "items":
                return items(items(Kind.UNKNOWN, (Kind.UNKNOWN, container.element)))
            if method in ("get", "pop") and node.args:
                if len(node.args) > 1:
                    return join(container.element, self.value(node.args[1]))
                if method == "get" and container.element is Kind.TENSOR:
                    return Kind.OPTIONAL
                return container.element
            if method == "copy":
                return container
            return Kind.UNKNOWN
        if method == "pop":
            return container.element
        if method == "copy":
            return container
        return Kind.UNKNOWN

    # -- bindings ------------------------------------------------------------------------

    def bind(self, target: ast.expr, value: Value, source: ast.expr | None) -> None:
        """``target = source`` where ``source`` has ``value``."""
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            note = self._note(source) if source is not None and informative(value) else None
            if note is None:
                self.annotated.pop(target.id, None)
            else:  # `version = metadata.get("version")`: the annotation of `metadata` decides
                self.annotated[target.id] = note
            if source is not None:
                self.origins[target.id] = source
            else:
                self.origins.pop(target.id, None)
        elif isinstance(target, ast.Attribute):
            self.record_attribute(target, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            sources = source.elts if isinstance(source, (ast.Tuple, ast.List)) else None
            if sources is not None and len(sources) == len(target.elts):
                for element, element_source in zip(target.elts, sources, strict=True):
                    self.bind(element, self.value(element_source), element_source)
            else:
                self.unpack(target, value)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, Kind.NOT_TENSOR, None)
        else:
            for name in bound_names(target):
                self.bind(ast.Name(name), Kind.UNKNOWN, None)

    def unpack(
        self, target: ast.Tuple | ast.List, value: Value, origin: ast.expr | None = None
    ) -> None:
        """``a, b = value``: positions of a tuple of known length, else each element."""
        elements = target.elts
        starred = any(isinstance(e, ast.Starred) for e in elements)
        if isinstance(value, Items) and not value.mapping:
            positions = value.positions
            if positions is not None and len(positions) == len(elements) and not starred:
                for element, position in zip(elements, positions, strict=True):
                    self.bind_element(element, position, origin)
                return
            for element in elements:
                if isinstance(element, ast.Starred):
                    self.bind_element(element.value, items(value.element), origin)
                else:
                    self.bind_element(element, value.element, origin)
            return
        for element in elements:
            self.bind_element(element, Kind.UNKNOWN)

    def bind_element(self, target: ast.expr, value: Value, origin: ast.expr | None = None) -> None:
        """Bind a ``for`` / comprehension target, or one part of an unpacking, to ``value``
        taken out of ``origin`` (whose annotation, if it made the value, the name keeps)."""
        if isinstance(target, (ast.Tuple, ast.List)):
            self.unpack(target, value, origin)
            return
        self.bind(target, value, None)
        if isinstance(target, ast.Name) and origin is not None and informative(value):
            note = self._note(origin)
            if note is not None:
                self.annotated[target.id] = note

    def record_attribute(self, target: ast.expr, value: Value) -> None:
        """``self.x = <tensor>`` inside a class: ``self.x`` is a tensor in every method
        checked afterwards (an annotation wins over an assignment)."""
        if not self.class_stack or not isinstance(target, ast.Attribute):
            return
        if not is_self_attr(target):
            return
        members = self.classes.setdefault(self.class_stack[-1], {})
        if informative(value) and value is not Kind.SCALAR and target.attr not in members:
            members[target.attr] = value

    # -- provenance: which annotation made a value a tensor ------------------------------

    def provenance(self, node: ast.expr) -> str | None:
        """Which annotation made ``node`` a tensor, when one did."""
        note = self._note(node)
        if note is None:
            return None
        text = " ".join((self.segment(note.annotation) or "?").split())
        return f"{note.what} annotated `{text}` on line {note.annotation.lineno}"

    def _note(self, node: ast.expr) -> Note | None:
        if isinstance(node, ast.NamedExpr):
            return self._note(node.value)
        if isinstance(node, (ast.Compare, ast.BinOp)):
            sides = (
                [node.left, *node.comparators]
                if isinstance(node, ast.Compare)
                else [
                    node.left,
                    node.right,
                ]
            )
            for side in sides:
                if self.kind(side) in FLAGGED and (note := self._note(side)) is not None:
                    return note
            return None
        if isinstance(node, ast.UnaryOp):
            return self._note(node.operand)
        if isinstance(node, ast.Subscript) and not is_self_attr(node.value):
            return self._note(node.value)
        if isinstance(node, ast.Name):
            return self.annotated.get(node.id)
        if self.class_stack and is_self_attr(node):
            assert isinstance(node, ast.Attribute)
            return self.annotated_members.get((self.class_stack[-1], node.attr))
        if isinstance(node, ast.Call):
            parts = dotted(node.func)
            if parts is not None and len(parts) == 1:
                return self.annotated_functions.get(parts[0])
            if parts is not None and len(parts) == 2 and parts[0] == "self" and self.class_stack:
                return self.annotated_members.get((self.class_stack[-1], parts[1] + "()"))
            if isinstance(node.func, ast.Attribute):  # `d.get(k)`, `x.float()`
                return self._note(node.func.value)
        if isinstance(node, ast.Attribute) and not is_self_attr(node):
            return self._note(node.value)
        return None

    def segment(self, node: ast.expr) -> str | None:
        """``node``'s source text (``ast.get_source_segment`` splits the whole file per call)."""
        end_line, end_col = node.end_lineno, node.end_col_offset
        if end_line is None or end_col is None or end_line > len(self.lines):
            return None
        first = self.lines[node.lineno - 1].encode("utf-8")
        if node.lineno == end_line:
            return first[node.col_offset : end_col].decode("utf-8", errors="replace")
        last = self.lines[end_line - 1].encode("utf-8")
        middle = self.lines[node.lineno : end_line - 1]
        return "".join(
            [
                first[node.col_offset :].decode("utf-8", errors="replace"),
                *middle,
                last[:end_col].decode("utf-8", errors="replace"),
            ]
        )


def _compares_with_a_non_number(node: ast.Compare) -> bool:
    """``t != []``, ``t == "a"``, ``t == None``: a tensor's ``==`` / ``!=`` return
    NotImplemented for lists, tuples, strings and None, and Python answers with a bool."""
    if not all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
        return False
    displays = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp)
    return any(
        isinstance(side, displays)
        or (
            isinstance(side, ast.Constant)
            and (side.value is None or isinstance(side.value, (str, bytes)))
        )
        for side in (node.left, *node.comparators)
    )


def _scalar_construction(node: ast.Call, name: str) -> bool:
    """``torch.rand([])``, ``torch.zeros(())``, ``torch.full((), v)``, ``torch.tensor(3.0)``."""
    if not node.args:
        return False
    first = node.args[0]
    if isinstance(first, ast.UnaryOp) and isinstance(first.op, (ast.USub, ast.UAdd)):
        first = first.operand
    if name in ("tensor", "as_tensor"):
        if isinstance(first, ast.Call) and isinstance(first.func, ast.Name):
            return first.func.id in ("float", "int", "bool")  # torch.tensor(float("inf"))
        return isinstance(first, ast.Constant) and isinstance(first.value, (int, float, bool))
    return (
        isinstance(first, (ast.List, ast.Tuple))
        and not first.elts
        and (name == "full" or len(node.args) == 1)
    )


def _asks_for_tuple(node: ast.Call, name: str) -> bool:
    """``unique(..., return_counts=True)``, ``nonzero(as_tuple=True)``."""
    keywords = TUPLE_WHEN_ASKED.get(name, ())
    return any(
        k.arg in keywords and not (isinstance(k.value, ast.Constant) and not k.value.value)
        for k in node.keywords
    )


def _no_dim(node: ast.Call, positional: int) -> bool:
    """A reduction with no dim: no positional args beyond ``positional``, no dim/axis kw."""
    if len(node.args) > positional:
        return False
    return not any(k.arg in ("dim", "axis") for k in node.keywords)
