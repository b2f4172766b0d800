"""A check's several problems, kept apart: :class:`Problems`.

A check that compares many things (a batch's requests, a variant's forms, an item's paths) finds
any number of problems and fails once, listing them. Joined into one string, one problem that a
known deviation's pattern matches would excuse every other problem beside it; kept apart, a
deviation explains the failure only when its pinned cause matches each problem
(:meth:`harness.jobs.deviations.Deviation.cause_of`). Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence


class Problems(AssertionError):
    """The problems a check found, each a sentence, under a ``header`` that says where."""

    def __init__(self, header: str, problems: Sequence[str]) -> None:
        if not problems:
            raise ValueError("Problems: problems: expected at least one, got none")
        self.header = header
        self.problems = tuple(problems)
        super().__init__(header + "; ".join(self.problems))

    def each(self) -> list[str]:
        """Each problem as a failure of its own would state it: the header, then it."""
        return [self.header + problem for problem in self.problems]


def assert_no_problems(problems: Sequence[str], header: str = "") -> None:
    """Fail with :class:`Problems` where ``problems`` holds any."""
    if problems:
        raise Problems(header, problems)
