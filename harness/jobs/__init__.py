"""The commands users run, and what they read and write.

- ``conformance``: the main job (``nemotron-vl-conformance``): every target's checks into one
  report;
- ``supervisor``: each target's pytest process watched from outside (time and memory limits,
  restarts); ``processes``: a target's process group (its memory, signalling and killing it);
  ``stacks``: where a running check is, asked of its process from outside;
- ``forkserver``: the server each target process is forked from, having imported torch (and
  vLLM) once; ``preload``: what it imports (the mutation runner's forks import it too);
  ``warm``: servers kept between main jobs (``--keep-warm``), used while still current;
- ``cores``: the main job's cores, handed to the processes still running as others end;
- ``kept``: a target's clean run kept with what its outcomes came from, reused while none of
  it changed;
- ``results``: the results schema (what the plugin writes, what the supervisor hands on);
- ``report``: a run's verdict (:func:`~.report.verdict`, decided there alone) and the
  conformance report, Markdown and JSON;
- ``deviations``: the known-deviation files of ``fixtures/deviations/``;
- ``gate``: the pull-request gate (``nemotron-vl-gate``), a base and a head of vLLM compared;
  ``gate_sides``: its sides' runs and its two legs (the conformance suites, and the engine's
  on the CPU build); ``gate_report``: its delta report; ``gate_stages``: the checks that
  execute a change's functions first, then the rest; ``causes``: a failed check's cause
  (exception type and frame of vLLM's code), and failures grouped by it; ``scope``: the
  gate's scope table, the vLLM files and functions the checks execute (measured by
  ``harness.mutation.scope``);
- ``findings``: the reproductions of vLLM bugs against every installed vLLM
  (``nemotron-vl-findings``); ``releases``: the release matrix, every pinned deviation and
  finding per installed release (``nemotron-vl-releases``);
- ``bench_report``: speed goals over benchmarks (``nemotron-vl-bench-report``); ``load``: a
  bounded load run on vLLM's OpenAI-compatible server (``nemotron-vl-load``);
- ``speed``: how long a user waits for the main job and the gate (``nemotron-vl-speed``);
- ``flakes``: the flake hunt, main jobs under varied threads, orders and groupings, and every
  check whose outcome changed (``nemotron-vl-flakes``);
- ``calibrate``: the parity bounds from measured error (``nemotron-vl-calibrate``);
  ``calibrate_engine``: the engine's log-probability bounds (``nemotron-vl-calibrate-engine``);
- ``runtimes``: where each target's checks run (which Python, which suite, which fork server).

May import: ``oracles`` (the calibration measures as the checks do), ``targets`` (the
categories of a check's outcome), ``inputs``, ``checkpoints`` (the shared folders),
``model_files``, ``environment``. Nothing here imports pytest's plugin: the jobs start
pytest in processes of their own.
"""
