"""The conformance and regression harness for vLLM's Nano-Nemotron VL model.

- ``plugin``: the pytest entry point (``--target``, ``--device``, deviations, result recording).
- ``targets``: the implementations under test behind one small interface.
- ``inputs``: builders of valid multimodal keyword arguments for a model.
- ``results``: the results schema shared by the plugin (writer) and the report (reader).
- ``supervisor``: each target's pytest process watched from outside (time and memory limits,
  crashes, restarts, interruption).
- ``report``: the conformance report writers; ``conformance``: the main job's runner.
- ``gate``: the pull-request gate (base against head of a vLLM change, a delta report).
"""

from pathlib import Path

#: The repository root (``fixtures/``, ``reports/`` and the suites live under it).
ROOT = Path(__file__).resolve().parent.parent
