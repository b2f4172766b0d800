"""The harness's pytest plugin. Loaded by the root ``conftest.py``.

One module per concern, as pytest's own plugins are organised:

- ``target``: ``--target`` / ``--device``, loading the target, its fixtures, the ``gpu``
  marker's skip;
- ``hypothesis``: the hypothesis profiles (``default``, ``dev``, ``fuzz``) and the example database;
- ``deviations``: a target's known deviations applied as strict xfails;
- ``results``: per-check results written as JSON for the conformance report (the one writer of
  a check's result);
- ``checkpoints``: one set of checkpoint folders for the run and the processes it starts;
- ``groups``: ``--check-group K/N``, one process's share of a target's checks (whole modules);
- ``cores``: ``--core-share-file PATH``, torch's threads following the main job's share of the
  cores as its processes end; ``--thread-schedule N,M,...``, a count per check in turn (the
  flake hunt's);
- ``builds``: every model the vLLM target builds, under a measurement's wrapper (a build's work
  credited to every check that used it);
- ``config_reads``: ``--record-config-reads PATH``, which config fields the model's vLLM files
  read and in which checks; ``--ignore-config-field SECTION.FIELD``, as if vLLM ignored one.

May import: ``jobs`` (the results schema, the deviations file, where a check is:
``stacks``), ``targets``, ``inputs``,
``checkpoints``.
"""

PLUGINS = (
    "harness.plugin.hypothesis",
    "harness.plugin.target",
    "harness.plugin.deviations",
    "harness.plugin.results",
    "harness.plugin.checkpoints",
    "harness.plugin.groups",
    "harness.plugin.cores",
    "harness.plugin.config_reads",
)

pytest_plugins = list(PLUGINS)
