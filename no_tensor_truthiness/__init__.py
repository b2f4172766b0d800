"""``no-tensor-truthiness``: a lint that bans taking the truth value of a tensor.

Imports nothing heavy (no torch, no vLLM) and nothing of the harness: the pre-commit hook
installs in seconds.

- ``rules``: the rules (``TB`` codes) and their pages; ``torch_api``: what torch's API returns;
- ``inference``: what kind of value an expression is (tensor, bool, ...), layered over
  ``kinds`` (the values and how paths join), ``syntax`` (helpers over the tree),
  ``annotations`` (annotations read into kinds), ``evaluation`` (expressions and bindings)
  and ``narrowing`` (what a test tells inside its branches);
- ``typeaware``: the optional mypy-backed mode, kinds from inferred types across modules;
- ``checker``: one pass over a module, findings with their fixes; ``finding``: a finding;
  ``fixes``: the fixes applied to source; ``noqa``: suppression comments;
- ``config``: ``[tool.no-tensor-truthiness]``; ``runner``: files walked, cached, in parallel;
  ``output``: the output formats; ``cli``: the command line; ``flake8_plugin``: the rules inside
  flake8;
- ``survey``: the lint over large trees (crash-free counts, speed against ruff).
"""

from no_tensor_truthiness.checker import check_source
from no_tensor_truthiness.finding import Finding, Fix
from no_tensor_truthiness.kinds import Kind
from no_tensor_truthiness.rules import RULES

__all__ = ["RULES", "Finding", "Fix", "Kind", "check_source"]
