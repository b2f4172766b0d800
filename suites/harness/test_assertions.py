"""What the suites accept as a clear error: one meaning for every suite."""

from __future__ import annotations

import pytest

from harness.oracles.assertions import clear_error_problem, is_clear_error, raises_clear_error
from reference_impl.errors import FieldError


@pytest.mark.parametrize(
    ("exc", "clear"),
    [
        (ValueError("image_embeds: expected rank 3, got 4"), True),
        (TypeError("image_embeds: expected a tensor, got str"), True),
        (FieldError("image_embeds", "rank 3", 4), True),
        (ValueError("data has rank 4 but expected 3"), False),  # an internal field, not the key
        (KeyError("image_embeds"), False),  # a bare lookup: nothing expected, nothing given
        (AssertionError("image_embeds"), False),
        (RuntimeError("image_embeds: Boolean value of Tensor is ambiguous"), False),
        (IndexError("image_embeds: index 3 is out of bounds, got 3"), False),
        (ValueError("image_embeds is wrong"), False),  # neither what was expected nor given
        (ValueError("image_embeds: expected rank 3"), False),  # not what was given
        (ValueError("bad image_embeds: got rank 4"), False),  # not what was expected
        # vLLM's own wording, which meets the rule:
        (ValueError("image_embeds dim[1] expected 't'=12, got 11"), True),
        (
            ValueError("image_embeds [0] hidden dimension mismatch: got 65, but model expects 64"),
            True,
        ),
    ],
)
def test_clear_errors_name_the_callers_key_in_a_value_or_type_error(exc, clear):
    assert is_clear_error(exc, ["image_embeds"]) is clear


def test_a_call_that_succeeds_is_not_a_clear_error():
    with pytest.raises(AssertionError, match="the call succeeded"), raises_clear_error("x"):
        pass


@pytest.mark.parametrize(
    ("exc", "problem"),
    [
        (KeyError("image_embeds"), "a KeyError is not one of the clear error types"),
        (ValueError("data: expected rank 3, got 4"), "names none of the caller's keys"),
        (ValueError("image_embeds: rank 4"), "does not say what was expected"),
        (ValueError("image_embeds: expected rank 3"), "does not say what was given"),
    ],
)
def test_the_reason_an_error_is_unclear_is_stated(exc, problem):
    assert problem in clear_error_problem(exc, ["image_embeds"])
    with pytest.raises(AssertionError, match=problem), raises_clear_error("image_embeds"):
        raise exc
