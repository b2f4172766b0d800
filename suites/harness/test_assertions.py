"""What the suites accept as a clear error: one meaning for every suite."""

from __future__ import annotations

import pytest

from harness.assertions import is_clear_error, raises_clear_error
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
    ],
)
def test_clear_errors_name_the_callers_key_in_a_value_or_type_error(exc, clear):
    assert is_clear_error(exc, ["image_embeds"]) is clear


def test_a_call_that_succeeds_is_not_a_clear_error():
    with pytest.raises(AssertionError, match="the call succeeded"), raises_clear_error("x"):
        pass
