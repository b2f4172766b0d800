"""The rules of the tensor-truthiness lint: every code, its documentation and its messages.

This is the one place rule codes are defined. ``no-tensor-truthiness rule CODE``, the
``--list-rules`` output, the SARIF rule table and the README's rule table are all rendered
from :data:`RULES`. Codes are stable: never renumbered, never reused.

The bug every rule is about (vLLM PR #56398)::

    if image_embeds := kwargs.pop("image_embeds", None):   # a [n, f, h] tensor: RuntimeError
        ...
"""

from __future__ import annotations

from dataclasses import dataclass

from no_tensor_truthiness.kinds import Kind

FILE_NOT_CHECKED = "TB000"
IF = "TB001"
WHILE = "TB002"
NOT = "TB003"
BOOL_OP = "TB004"
ASSERT = "TB005"
BOOL_CALL = "TB006"
CONDITIONAL_EXPRESSION = "TB007"
COMPREHENSION_FILTER = "TB008"
WALRUS = "TB009"
INTERNAL_ERROR = "TB999"

#: Why taking the truth of a tensor is a bug, shared by every truth-context rule.
_WHY = (
    "`bool(tensor)` is defined only for a tensor of exactly one element. With more elements "
    "it raises `RuntimeError: Boolean value of Tensor with more than one value is ambiguous`; "
    "with one element it silently tests that element's value, not whether the tensor is there "
    "or empty, and on an accelerator it also forces a device-to-host synchronisation. Code "
    "that passes its tests with one-element or `None` inputs fails in production on the first "
    "real batch (vLLM #56398: every request with precomputed image embeddings crashed)."
)


@dataclass(frozen=True)
class Rule:
    """One rule: ``code`` is what users select, ignore and ``noqa``; ``context`` is the truth
    context it covers, as messages show it."""

    code: str
    name: str
    context: str
    what: str
    why: str
    example: str
    fix: str
    fixable: bool = True  # an (unsafe) automatic fix exists for some of its findings

    def doc(self) -> str:
        """The rule's page, as ``no-tensor-truthiness rule CODE`` prints it."""
        fix = "available (unsafe: `--fix --unsafe-fixes`)" if self.fixable else "not available"
        return (
            f"# {self.name} ({self.code})\n\n"
            f"Fix is {fix}.\n\n"
            f"## What it does\n{self.what}\n\n"
            f"## Why is this bad?\n{self.why}\n\n"
            f"## Example\n```python\n{self.example.strip()}\n```\n\n"
            f"## Use instead\n```python\n{self.fix.strip()}\n```\n"
        )


def _truth_rule(code: str, name: str, context: str, what: str, example: str, fix: str) -> Rule:
    return Rule(code, name, context, what, _WHY, example, fix)


RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        Rule(
            FILE_NOT_CHECKED,
            "file-not-checked",
            "file not checked",
            "Reports a file the lint could not check: a syntax error, text that is not UTF-8, "
            "or nesting deeper than Python's parser allows.",
            "A file that is not checked can hold any number of the bugs the other rules find; "
            "the lint says so instead of passing it silently.",
            "def broken(:\n    pass",
            "def fixed():\n    pass",
            fixable=False,
        ),
        _truth_rule(
            IF,
            "tensor-in-if",
            "`if` / `elif` condition",
            "Finds a tensor (or a value that may be a tensor or None) used as the condition of "
            "an `if` or `elif` statement or of a `match` case guard.",
            "def f(mask: torch.Tensor | None):\n    if mask:\n        ...",
            "def f(mask: torch.Tensor | None):\n    if mask is not None:\n        ...",
        ),
        _truth_rule(
            WHILE,
            "tensor-in-while",
            "`while` condition",
            "Finds a tensor used as the condition of a `while` loop.",
            "hit = torch.isin(ids, stop_ids)\nwhile hit:\n    ...",
            "hit = torch.isin(ids, stop_ids)\nwhile hit.any():\n    ...",
        ),
        _truth_rule(
            NOT,
            "tensor-in-not",
            "`not` operand",
            "Finds a tensor used as the operand of `not`.",
            "if not image_embeds:\n    return None",
            "if image_embeds is None:\n    return None",
        ),
        _truth_rule(
            BOOL_OP,
            "tensor-in-bool-op",
            "`and` / `or` operand",
            "Finds a tensor whose truth `and` / `or` takes: every operand but the last, and the "
            "last too when the whole expression is itself tested for truth.",
            "if pixel_values and n > 0:\n    ...",
            "if pixel_values is not None and n > 0:\n    ...",
        ),
        _truth_rule(
            ASSERT,
            "tensor-in-assert",
            "`assert` condition",
            "Finds a tensor used as the condition of an `assert` statement.",
            "assert torch.isfinite(x)",
            "assert torch.isfinite(x).all()",
        ),
        _truth_rule(
            BOOL_CALL,
            "tensor-in-bool-call",
            "`bool()` argument",
            "Finds a tensor passed to `bool()`.",
            "has_audio = bool(audio_features)",
            "has_audio = audio_features is not None",
        ),
        _truth_rule(
            CONDITIONAL_EXPRESSION,
            "tensor-in-conditional-expression",
            "conditional-expression test",
            "Finds a tensor used as the test of a conditional expression (`a if t else b`).",
            "n = len(embeds) if embeds else 0",
            "n = len(embeds) if embeds is not None else 0",
        ),
        _truth_rule(
            COMPREHENSION_FILTER,
            "tensor-in-comprehension-filter",
            "comprehension filter",
            "Finds a tensor used as an `if` filter of a list, set, dict or generator "
            "comprehension, including an element of a container of tensors.",
            "kept = [t for t in torch.split(x, 2) if t]",
            "kept = [t for t in torch.split(x, 2) if t.numel() > 0]",
        ),
        _truth_rule(
            WALRUS,
            "tensor-in-walrus-test",
            "walrus binding tested for truth",
            "Finds an assignment expression (`:=`) whose value is a tensor or None and whose "
            "result is tested for truth: the pattern of vLLM #56398.",
            'if image_embeds := kwargs.pop("image_embeds", None):\n    ...',
            'if (image_embeds := kwargs.pop("image_embeds", None)) is not None:\n    ...',
        ),
        Rule(
            INTERNAL_ERROR,
            "internal-error",
            "internal error",
            "Reports a file on which the checker itself failed.",
            "It is a bug in the lint, never in your code: the file is reported instead of the "
            "run crashing, so the rest of the tree is still checked. Please report it.",
            "# any file the checker fails on",
            "# nothing to change in your code",
            fixable=False,
        ),
    )
}

#: The codes that are not a truth context: always reported, whatever the selection.
ALWAYS_REPORTED = frozenset({FILE_NOT_CHECKED, INTERNAL_ERROR})


def rule_table() -> str:
    """The Markdown table of the rules (the README's, and ``--list-rules --format markdown``)."""
    rows = ["| code | name | what it finds | fix |", "|---|---|---|---|"]
    for rule in RULES.values():
        rows.append(
            f"| `{rule.code}` | {rule.name} | {rule.context} | "
            f"{'unsafe' if rule.fixable else 'none'} |"
        )
    return "\n".join(rows) + "\n"


def rule_lines() -> str:
    """One line per rule (``--list-rules``)."""
    return "".join(f"{r.code}  {r.name:<34} {r.context}\n" for r in RULES.values())


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
    if code == WALRUS:
        name = text.split(":=")[0].strip("( ")
        return (
            f"walrus-bound {kind.value} `{text}` tested for truth: bind it first, then "
            f"{fix_hint(kind, name)}"
        )
    return f"{kind.value} `{text}` as {RULES[code].context}: {fix_hint(kind, text, elementwise)}"
