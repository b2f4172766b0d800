"""The conformance and regression harness for vLLM's Nano-Nemotron VL model.

Rooms by job; each subpackage's docstring says what lives there and what it may import (the
layers of ``[tool.importlinter]`` in ``pyproject.toml``, checked by ``lint-imports``):

- ``plugin``: the pytest plugin (the target option, known deviations as xfails, results,
  checkpoint folders, hypothesis profiles).
- ``jobs``: the commands users run: the main job and its supervisor, results and the report,
  known deviations, the pull-request gate, the findings table, the bench report.
- ``mutation``: the regression corpus, its kill matrix and the mutation score, with the file
  mutants they write.
- ``gpu``: the GPU run (vLLM's kernels, the reference at real widths, throughput, the bundle
  carried to the GPU machine, its summary).
- ``oracles``: independent implementations (transformers, vLLM's own layers), output
  comparisons and their bounds.
- ``targets``: the implementations under test behind one small interface.
- ``inputs``: requests (types, media, the catalogue), model keyword arguments, hypothesis
  strategies.
- ``checkpoints``: what is served: a checkpoint variant, its folder (written once per run), its
  weight streams and LoRA adapters, and the serving configuration it is served with.
- ``model_files``: the model's vLLM files, where the installed ones are, and the mutant writer
  (torch-free: the gate, both mutation tools and the vLLM target use it).
- ``runs_on``: what a check runs on (a request, a real model, the LoRA manager, the processing
  info, functions): the one vocabulary of targets, results and the report.
- ``environment``: the process environment every run needs.
- ``release_environments``: a vLLM release's environment built from the package index (its own
  requirements, with the documented omissions of ``fixtures/release_overrides.toml``), and the
  installed release read without importing vLLM.
- ``toml_tables``: the reader of the TOML fixtures (known deviations, unreached lines, config
  fields' reasons).
- ``machine``: the CPU family a run's numbers depend on (AMX, AVX-512, AVX2), read from its
  flags.
- ``problems``: a check's several problems kept apart, so that a known deviation must explain
  each of them.
- ``timings``: the test run's time budget, per stream and per module, read against the JUnit
  files a run wrote.
- ``numerics``: what a result's bits depend on besides its inputs (torch's thread count): the key
  of results kept for a later bit-exact comparison.

Every command is a console script (``[project.scripts]`` in ``pyproject.toml``), so commands do not
depend on module paths.
"""

from pathlib import Path

#: The repository root (``fixtures/``, ``reports/`` and the suites live under it).
ROOT = Path(__file__).resolve().parent.parent
