"""``no-tensor-truthiness``: a lint that bans taking the truth value of a tensor.

Imports nothing heavy (no torch, no vLLM): the pre-commit hook installs in seconds.
"""

from harness.lint.checker import check_source
from harness.lint.finding import Finding, Fix
from harness.lint.inference import Kind
from harness.lint.rules import RULES

__all__ = ["RULES", "Finding", "Fix", "Kind", "check_source"]
