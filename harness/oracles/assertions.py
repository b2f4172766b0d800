"""Assertions shared by the suites: what a "clear error" is, and output comparisons."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

#: Exception types a user can act on (our field errors are ValueErrors). AssertionError (a bare
#: ``assert`` in model code), KeyError and other lookup errors (a bare ``kwargs[key]`` says
#: neither what was expected nor what was given), IndexError and RuntimeError (torch's own
#: errors, e.g. tensor truthiness) are not clear errors.
CLEAR_ERROR_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError)
#: Words by which a message states what was expected ...
EXPECTED_CUES = (
    "expect",
    "must",
    "should",
    "require",
    "only",
    "either",
    "available",
    "allowed",
    "supported",
    "missing",
    "unexpected",
    "mismatch",
)
#: ... and what was given (``missing`` / ``unexpected`` / ``mismatch`` say both at once).
GIVEN_CUES = (
    "got",
    "given",
    "but",
    "found",
    "received",
    "instead",
    "there is no",
    "missing",
    "unexpected",
    "mismatch",
    "input_value",  # pydantic's validation errors: ``[type=less_than, input_value=1.5, ...]``
)


def clear_error_problem(exc: BaseException, fields: Sequence[str]) -> str | None:
    """Why ``exc`` is not a clear error for a caller who gave ``fields``; None when it is.

    One meaning for every suite: a ValueError or TypeError whose message names one of the
    caller's keys (not an internal field such as a schema's ``data``), states what was expected
    and what was given.
    """
    if not isinstance(exc, CLEAR_ERROR_TYPES):
        return f"a {type(exc).__name__} is not one of the clear error types"
    message = str(exc)
    if not any(f in message for f in fields):
        return f"the message names none of the caller's keys {list(fields)}"
    lowered = message.lower()
    if not any(cue in lowered for cue in EXPECTED_CUES):
        return "the message does not say what was expected"
    if not any(cue in lowered for cue in GIVEN_CUES):
        return "the message does not say what was given"
    return None


#: Exception classes an engine's API server answers as the client's error (HTTP 400, the message
#: shown to the user): vLLM's validation errors derive from this one.
CLIENT_ERROR_CLASSES = ("VLLMClientError",)


def refusal_problem(exc: BaseException, names: Sequence[str]) -> str | None:
    """Why ``exc`` is not a refusal a user can act on; None when it is: a ValueError or
    TypeError, or an error the engine's server returns to the client as the client's
    (:data:`CLIENT_ERROR_CLASSES`), whose message names one of ``names`` (the option to change,
    or the limit that was hit)."""
    classes = {cls.__name__ for cls in type(exc).__mro__}
    if not isinstance(exc, CLEAR_ERROR_TYPES) and not classes & set(CLIENT_ERROR_CLASSES):
        return f"a {type(exc).__name__} is neither a ValueError/TypeError nor a client error"
    if not any(name in str(exc) for name in names):
        return f"the message names none of {list(names)}"
    return None


@contextlib.contextmanager
def refused_naming(*names: str) -> Iterator[None]:
    """The block must be refused with an error a user can act on, naming one of ``names``
    (:func:`refusal_problem`)."""
    try:
        yield
    except Exception as exc:
        assert_refusal(exc, names)
    else:
        raise AssertionError(f"expected a refusal naming one of {list(names)}; it was served")


def assert_refusal(exc: BaseException, names: Sequence[str]) -> None:
    problem = refusal_problem(exc, names)
    assert problem is None, (
        f"expected a refusal naming one of {list(names)}, got {type(exc).__name__}: {exc} "
        f"({problem})"
    )


def is_clear_error(exc: BaseException, fields: Sequence[str]) -> bool:
    """An actionable exception: see :func:`clear_error_problem`."""
    return clear_error_problem(exc, fields) is None


def assert_clear_error(exc: BaseException, fields: Sequence[str]) -> None:
    problem = clear_error_problem(exc, fields)
    assert problem is None, (
        f"expected a clear error naming one of {list(fields)}, got {type(exc).__name__}: {exc}\n"
        f"(not clear: {problem}; a clear error is a ValueError or TypeError naming the caller's "
        "key, what was expected and what was given)"
    )


@contextlib.contextmanager
def raises_clear_error(*fields: str) -> Iterator[None]:
    """The block must raise a clear error naming one of ``fields`` (any other outcome fails)."""
    try:
        yield
    except Exception as exc:
        assert_clear_error(exc, fields)
    else:
        raise AssertionError(
            f"expected a clear error naming one of {list(fields)}; the call succeeded"
        )


def _assert_counts_and_shapes(
    actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str
) -> None:
    assert len(actual) == len(expected), (
        f"{what}: expected {len(expected)} outputs, got {len(actual)}"
    )
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape, f"{what}[{i}]: shape {tuple(a.shape)}, expected {tuple(e.shape)}"


def assert_same_tensors(
    actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str
) -> None:
    """Same count, and each actual tensor ``torch.equal`` to its expected one (dtype included)."""
    _assert_counts_and_shapes(actual, expected, what)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype}, expected {e.dtype}"
        assert torch.equal(a.cpu(), e.cpu()), f"{what}[{i}]: values differ from the input"


def assert_close_tensors(
    actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str
) -> None:
    """Same count and shapes, values equal up to float rounding."""
    _assert_counts_and_shapes(actual, expected, what)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(a.float().cpu(), e.float().cpu(), msg=f"{what}[{i}] differs")
