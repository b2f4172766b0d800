"""Inference: what one module's expressions hold, from the syntax alone.

A value is a :class:`Kind` (what its truth value means) or :class:`Items` (a container whose
elements are known: what iterating, indexing or unpacking it yields). Tensor-ness comes from, in
order of strength:

- ``torch.*`` constructors and ops and ``torch.nn.functional.*`` (and their aliases): a tensor
  whatever their arguments' types, a 0-d tensor only from a 0-d argument of an op that keeps the
  number of elements; ``nn.Parameter``; tuple-returning ops (``torch.split``, ``chunk``,
  ``unbind``, ``sort``, ``max(dim=)``, ...) give containers of tensors;
- tensor methods on tensors (``x.float()``, ``x.view(...)``; not ``.item()``, ``.numel()``,
  ``.tolist()``, ``.shape``; full reductions such as ``.any()`` or ``.sum()`` give a 0-d tensor,
  whose truth is defined);
- annotations: parameters, variables, class attributes and function returns annotated
  ``Tensor`` / ``Tensor | None`` / ``Optional[Tensor]``, and containers of them
  (``list[Tensor]``, ``tuple[Tensor, ...]``, ``Sequence[Tensor]``, ``dict[str, Tensor]``, ...);
- ``.pop`` / ``.get`` / subscripts of multimodal input keys (``*_embeds``, ``pixel_values*``,
  ``*_features``, ...): a tensor, a list or None;
- assignments, walrus bindings, ``for`` targets, comprehensions, tuple unpacking, arithmetic and
  comparisons of the above; branches join (``x = None`` on one path and a tensor on the other
  gives "tensor or None").

``isinstance(x, list)`` / ``isinstance(x, torch.Tensor)`` / ``x is None`` narrow ``x`` inside the
branch. Subscripts and rows of tensors (``mask[i]``, ``for row in x``) are not tensors here: they
are often 0-d.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias

from no_tensor_truthiness.torch_api import (
    DIM_TUPLE_REDUCTIONS,
    ELEMENT_PRESERVING_BUILTINS,
    LINALG_NORMS,
    MAPPING_TYPES,
    NAMED_TUPLE_TENSOR_FIELDS,
    NON_TENSOR_ATTRS,
    NON_TENSOR_BUILTINS,
    NON_TENSOR_METHOD_PREFIXES,
    NON_TENSOR_METHODS,
    NUMEL_CHANGING,
    SEQUENCE_TYPES,
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


class Kind(Enum):
    """What the inference knows of an expression's truth value."""

    UNKNOWN = "unknown"  # never flagged
    NOT_TENSOR = "not a tensor"
    NONE = "None"
    TENSOR = "tensor"  # may have more than one element: truth is ambiguous
    OPTIONAL = "tensor or None"  # also: a tensor, a list or None (multimodal inputs)
    SCALAR = "0-d tensor"  # full reductions, .any(), .all(): truth is defined

    # Members are singletons: identity hashing keeps `kind in FLAGGED` out of Python code
    # (Enum's own __hash__ is a Python function, called hundreds of thousands of times).
    __hash__ = object.__hash__


#: Kinds whose truth test is a finding.
FLAGGED = frozenset({Kind.TENSOR, Kind.OPTIONAL})


@dataclass(frozen=True)
class Items:
    """A container (possibly None) with known elements: ``element`` is what iterating or
    indexing it yields (for a mapping, its values); ``positions`` the elements of a tuple of
    known length. Its own truth is defined (emptiness)."""

    element: Value
    positions: tuple[Value, ...] | None = None
    mapping: bool = False


Value: TypeAlias = Kind | Items


@dataclass(frozen=True)
class Note:
    """A kind that came from an annotation: ``what`` it describes ("`x` is") and the
    annotation itself (rendered only when a finding shows it)."""

    what: str
    annotation: ast.expr


#: The type-aware mode's lookup: an expression's kind as mypy inferred it, or None.
Oracle = Callable[[ast.expr], "Kind | None"]


def informative(value: Value) -> bool:
    """Whether a value tells the checker more than "not a tensor"."""
    return isinstance(value, Items) or value in FLAGGED or value is Kind.SCALAR


def items(element: Value, positions: tuple[Value, ...] | None = None) -> Value:
    """A sequence of ``element`` (or of ``positions``); plain NOT_TENSOR when neither says
    anything about tensors (keeps environments small)."""
    if informative(element) or (positions and any(informative(p) for p in positions)):
        return Items(element, positions)
    return Kind.NOT_TENSOR


def mapping(values: Value) -> Value:
    return Items(values, mapping=True) if informative(values) else Kind.NOT_TENSOR


def truth_kind(value: Value) -> Kind:
    return Kind.NOT_TENSOR if isinstance(value, Items) else value


def element_of(value: Value) -> Value:
    """What iterating ``value`` yields (a mapping's keys are not known; rows of a tensor are
    not counted as tensors)."""
    if isinstance(value, Items) and not value.mapping:
        return value.element
    return Kind.UNKNOWN


def join(a: Value, b: Value) -> Value:
    """The value of a name after two control-flow paths."""
    if a == b:
        return a
    if isinstance(a, Items) or isinstance(b, Items):
        # A container on one path and None on the other: still iterable where it is tested.
        if Kind.NONE in (a, b):
            return a if isinstance(a, Items) else b
        return Kind.UNKNOWN
    if {a, b} <= {Kind.TENSOR, Kind.OPTIONAL, Kind.NONE}:
        return Kind.OPTIONAL
    if Kind.SCALAR in (a, b) and {a, b} & FLAGGED:  # one element on one path only
        return b if a is Kind.SCALAR else a
    return Kind.UNKNOWN


def join_all(values: Sequence[Value]) -> Value:
    result = values[0] if values else Kind.UNKNOWN
    for value in values[1:]:
        result = join(result, value)
    return result


def join_envs(first: dict[str, Value], second: dict[str, Value]) -> dict[str, Value]:
    return {
        name: join(first.get(name, Kind.UNKNOWN), second.get(name, Kind.UNKNOWN))
        for name in first.keys() | second.keys()
    }


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


class Inference:
    """The state of one module's inference: the environment of the scope being checked, the
    module's functions and classes, and where annotated names got their kind."""

    def __init__(self, tree: ast.Module, source: str, tensor_key: str) -> None:
        self.tree = tree
        self.source = source
        self.key_pattern = re.compile(tensor_key)
        self.imports = Imports(tree)
        self.functions: dict[str, Value] = {}  # module-level functions' return values
        self.classes: dict[str, dict[str, Value]] = {}  # class -> attr / method() -> value
        self.class_stack: list[str] = []
        self.env: dict[str, Value] = {}
        self.module_env: dict[str, Value] = {}
        self.origins: dict[str, ast.expr] = {}  # name -> the expression last assigned to it
        self.reads: dict[int, frozenset[str]] = {}  # id(expression) -> the names it reads
        # Where a name, attribute or function's tensor-ness came from an annotation: "what the
        # annotation says (line N)", shown in findings so a wrong annotation is easy to spot.
        self.annotated: dict[str, Note] = {}
        self.annotated_members: dict[tuple[str, str], Note] = {}
        self.annotated_functions: dict[str, Note] = {}
        self.lines = source.splitlines(keepends=True)

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

    # -- the module pre-pass: functions, class attributes -------------------------------

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
                if second is None or _is_int(second):  # dim=, or a literal dim
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
                if first is None or _is_int(first):
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

    # -- narrowing -----------------------------------------------------------------------

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
        and _is_int(test.comparators[0])
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 1
    ):
        return None
    return test.left.func.value.id, isinstance(test.ops[0], ast.Eq)


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


def _is_int(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _no_dim(node: ast.Call, positional: int) -> bool:
    """A reduction with no dim: no positional args beyond ``positional``, no dim/axis kw."""
    if len(node.args) > positional:
        return False
    return not any(k.arg in ("dim", "axis") for k in node.keywords)
