"""The harness's pytest entry point. Loaded by the root ``conftest.py``.

One module per concern, as pytest's own plugins are organised:

- ``harness.pytest_target``: ``--target`` / ``--device``, loading the target, its fixtures,
  the ``gpu`` marker's skip, hypothesis profiles.
- ``harness.pytest_deviations``: a target's known deviations applied as strict xfails.
- ``harness.pytest_results``: per-check results written as JSON for the conformance report.
- ``harness.pytest_checkpoints``: one set of checkpoint folders for the run and the processes
  it starts.
"""

PLUGINS = (
    "harness.pytest_target",
    "harness.pytest_deviations",
    "harness.pytest_results",
    "harness.pytest_checkpoints",
)

pytest_plugins = list(PLUGINS)
