"""Rule codes and messages of the tensor-truthiness lint.

One code per pattern family; codes are stable (never renumbered). Each message names the context
and shows the fix: ``is not None`` for values that may be None, ``.numel()`` for emptiness,
``.any()`` / ``.all()`` for values, ``len()`` for lists.

The bug (vLLM PR #56398)::

    if image_embeds := kwargs.pop("image_embeds", None):   # a [n, f, h] tensor: RuntimeError
        ...

The fix::

    image_embeds = kwargs.pop("image_embeds", None)
    if image_embeds is not None:
        ...
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    """What the inference knows of an expression's value."""

    UNKNOWN = "unknown"  # never flagged
    NOT_TENSOR = "not a tensor"
    NONE = "None"
    TENSOR = "tensor"  # may have more than one element: truth is ambiguous
    OPTIONAL = "tensor or None"  # also: a tensor, a list or None (multimodal inputs)
    SCALAR = "0-d tensor"  # full reductions, .any(), .all(): truth is defined


FLAGGED = frozenset({Kind.TENSOR, Kind.OPTIONAL})


@dataclass(frozen=True)
class Rule:
    code: str
    context: str


RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        Rule("TB000", "file not checked"),
        Rule("TB001", "`if` / `elif` condition"),
        Rule("TB002", "`while` condition"),
        Rule("TB003", "`not` operand"),
        Rule("TB004", "`and` / `or` operand"),
        Rule("TB005", "`assert` condition"),
        Rule("TB006", "`bool()` argument"),
        Rule("TB007", "conditional-expression test"),
        Rule("TB008", "comprehension filter"),
        Rule("TB009", "walrus binding tested for truth"),
    )
}


def fix_hint(kind: Kind, text: str, elementwise: bool = False) -> str:
    """How to write the test instead, for an expression shown as ``text``."""
    shown = text if text.replace("_", "").replace(".", "").isalnum() else f"({text})"
    if elementwise:
        return f"reduce it: `{shown}.any()` or `{shown}.all()`"
    if kind is Kind.OPTIONAL:
        return f"test `{shown} is not None` (then `len()` for a list, `.numel()` for a tensor)"
    return f"test `{shown}.numel() > 0` for emptiness, or `.any()` / `.all()` for its values"


def message(code: str, kind: Kind, text: str, elementwise: bool = False) -> str:
    """The finding's message: what is wrong, then the fix."""
    if code == "TB009":
        name = text.split(":=")[0].strip("( ")
        return (
            f"walrus-bound {kind.value} `{text}` tested for truth: bind it first, then "
            f"{fix_hint(kind, name)}"
        )
    return f"{kind.value} `{text}` as {RULES[code].context}: {fix_hint(kind, text, elementwise)}"
