"""Mutation testing of vLLM's model code.

- ``file_mutants``: the corpus's hand-written faults (regressions put back into a copy of a
  model file; ``nemotron-vl-file-mutant NAME DIR`` writes one);
- ``ast_mutants``: first-order mutants generated from the installed files;
- ``reach``, ``reach_measure``: the score's scope, measured: which checks execute which lines;
- ``scope``: the gate's scope, measured (``nemotron-vl-scope``): every function of vLLM the
  checks execute, with the checks that execute it;
- ``scope_engine``: the engine leg's scope (``nemotron-vl-scope --engine``): every function of
  the CPU build's vLLM the engine and server suites run, in any of vLLM's processes;
- ``unreached``: why no check executes a line (``fixtures/unreached.toml``), joined with the map;
- ``corpus``: the regression corpus (``fixtures/corpus.toml``) and the checks each mutant must
  fail;
- ``runner``: suite runs against mutated files, in forked processes;
- ``matrix``: the kill matrix of the corpus (``nemotron-vl-kill-matrix``);
- ``history``: the order a mutant's checks run in, those that killed its neighbours first;
- ``score``: the mutation score (``nemotron-vl-mutation-score``);
- ``shards``: ``--shard K/N`` for both, and the checks their merges make;
- ``gate_history``: the gate on the model's upstream history (``nemotron-vl-gate-history``):
  each fix of the corpus gated both ways, its verdicts judged against the corpus's pins;
- ``config_fields``: the config-field inventory (``nemotron-vl-config-fields``): the fields
  vLLM's model code reads, recorded, and the checks that fail when vLLM ignores each;
- ``engine_perturbations``: what the engine checks' bounds still catch
  (``nemotron-vl-engine-perturbations``): the Mamba mixer's state scaled at one place by a known
  size, served through the engine, against the checks each comparison judges.

May import: ``jobs`` (results), ``checkpoints`` (the folder cache), ``model_files``; the runner
loads targets in its forked children.
"""
