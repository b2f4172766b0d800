"""What a target's output is compared with, and how.

- ``transformers_models``: independent implementations (transformers' ``NemotronHForCausalLM``)
  with random weights;
- ``vllm_layers``: vLLM's own layers on CPU as oracles for the reference;
- ``assertions``: what a clear error is, refusals, output comparisons;
- ``parity``: the bounds of parity with the reference, the sensitivity each path must have for
  them to mean something, and the features compared before the towers.

May import: ``targets`` (vLLM's CPU runtime), ``inputs``, ``checkpoints``.
"""
