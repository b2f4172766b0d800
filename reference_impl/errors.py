"""The one error shape of the reference implementation: the field, the expected, the actual."""

from __future__ import annotations


class FieldError(ValueError):
    """A value does not satisfy its contract: ``"<field>: expected <expected>, got <actual>"``."""

    def __init__(self, field: str, expected: str, actual: object) -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        super().__init__(f"{field}: expected {expected}, got {actual}")


class ConfigError(FieldError):
    """A configuration field has an invalid value. The message names the field."""

    def __init__(self, field: str, expected: str, actual: object) -> None:
        super().__init__(f"config field {field!r}", expected, repr(actual))
        self.field_name = field
