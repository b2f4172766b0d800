"""The conformance and regression harness for vLLM's Nano-Nemotron VL model.

- ``plugin``: the pytest entry point (``--target``, ``--device``, deviations, result recording).
- ``targets``: the implementations under test behind one small interface.
- ``inputs``: builders of valid multimodal keyword arguments for a model.
- ``report``: the conformance report writers; ``conformance``: the main job's runner.
"""

from pathlib import Path

#: The repository root (``fixtures/``, ``reports/`` and the suites live under it).
ROOT = Path(__file__).resolve().parent.parent
