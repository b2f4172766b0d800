"""What the lint reports: a finding, and the edit that fixes it when one exists."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fix:
    """Replace the text from (``line``, ``col``) to (``end_line``, ``end_col``) with
    ``replacement``. Lines are 1-based, columns 0-based character offsets. Every fix of this lint
    is unsafe in ruff's sense: it changes behaviour for some input (an empty tensor, a
    one-element tensor, an empty list)."""

    line: int
    col: int
    end_line: int
    end_col: int
    replacement: str


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based
    code: str
    message: str
    end_line: int = 0
    end_col: int = 0
    fix: Fix | None = field(default=None, compare=False)

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"
