"""The kind lattice: what the inference knows of a value.

A value is a :class:`Kind` (what its truth value means) or :class:`Items` (a container whose
elements are known); a :class:`Note` says which annotation a kind came from. :func:`join` and its
relatives merge the values of two control-flow paths.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias


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
