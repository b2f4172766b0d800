"""The conformance and regression harness for vLLM's Nano-Nemotron VL model.

- ``plugin``: the pytest entry point, made of ``pytest_target`` (``--target``, ``--device``),
  ``pytest_deviations`` (known deviations as strict xfails), ``pytest_results`` (results JSON)
  and ``pytest_checkpoints`` (one set of checkpoint folders per run).
- ``targets``: the implementations under test behind one small interface.
- ``checkpoint``: tiny checkpoint folders written from the reference (``python -m
  harness.checkpoint DIR`` writes one); ``lora_adapters``: LoRA adapter folders for them, as PEFT
  saves them; ``shared_checkpoints``:
  one run's folders shared by every process; ``weight_streams``: tensors streamed as loaders
  stream them.
- ``serving``: serving configurations, the options of ``vllm serve`` a user sets (an axis
  beside the checkpoint variant).
- ``requests``: a user's multimodal request and what an engine makes of it; ``model_kwargs``:
  builders of valid multimodal keyword arguments for a model; ``strategies``: hypothesis
  strategies over both.
- ``assertions``: what a clear error is, and output comparisons; ``parity``: the bounds of
  parity with the reference, the sensitivity each path must have for them to mean something,
  and the features compared before the towers; ``deviations``: known
  deviations; ``oracles``: independent implementations (transformers) with random weights;
  ``vllm_layers``: vLLM's own layers on CPU as oracles.
- ``results``: the results schema; ``report``: the conformance report; ``conformance``: the
  main job; ``supervisor``: each target's pytest process watched from outside; ``gate``: the
  pull-request gate; ``findings``: the reproductions of vLLM bugs run against the installed
  vLLM, as a table linking each one's issue text.
- ``mutation``: the regression corpus, its kill matrix and the mutation score; ``lint``: the
  tensor-truthiness lint (installs alone); ``bench_report``: speed goals over benchmarks;
  ``environment``: the process environment every run needs.
- The GPU run: ``vllm_kernels``: vLLM's Mamba kernels loaded alone, and their launch metadata;
  ``real_widths``: the reference's layers at the published widths; ``gpu_throughput``: their
  throughput against the GPU's peak; ``gpu_bundle``: vLLM's sources carried to a GPU machine;
  ``gpu_summary``: the run's summary page.
"""

from pathlib import Path

#: The repository root (``fixtures/``, ``reports/`` and the suites live under it).
ROOT = Path(__file__).resolve().parent.parent
