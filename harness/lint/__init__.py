"""``no-tensor-truthiness``: a lint that bans taking the truth value of a tensor.

Imports nothing heavy (no torch, no vLLM): the pre-commit hook installs in seconds.
"""

from harness.lint.checker import Finding, check_source
from harness.lint.rules import RULES, Kind

__all__ = ["RULES", "Finding", "Kind", "check_source"]
