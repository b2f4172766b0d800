"""Assertions shared by the suites: what a "clear error" is, and output comparisons."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

#: Exception types a user can act on (our field errors are ValueErrors). AssertionError (a bare
#: ``assert`` in model code), KeyError and other lookup errors (a bare ``kwargs[key]`` says
#: neither what was expected nor what was given) and RuntimeError (torch's own errors, e.g.
#: tensor truthiness) are not clear errors. A clear error names the caller's key, not an
#: internal field.
CLEAR_ERROR_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError)


def is_clear_error(exc: BaseException, fields: Sequence[str]) -> bool:
    """An actionable exception whose message names one of ``fields``."""
    return isinstance(exc, CLEAR_ERROR_TYPES) and any(f in str(exc) for f in fields)


def assert_clear_error(exc: BaseException, fields: Sequence[str]) -> None:
    assert is_clear_error(exc, fields), (
        f"expected a clear error (one of {[t.__name__ for t in CLEAR_ERROR_TYPES]}) naming one "
        f"of {list(fields)}, got {type(exc).__name__}: {exc}"
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
