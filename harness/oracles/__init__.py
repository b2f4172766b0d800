"""What a target's output is compared with, and how.

- ``transformers_models``: independent implementations (transformers' ``NemotronHForCausalLM``)
  with random weights;
- ``vllm_layers``: vLLM's own layers on CPU as oracles for the reference;
- ``assertions``: what a clear error is, refusals, output comparisons;
- ``parity``: the analytic ceilings of parity with the reference, the sensitivity each path must
  have for them to mean something, and the features compared before the towers;
- ``bounds``: the parity bounds derived per path, dtype and statistic from measured error (the
  calibration tables: the default tower shape's, and each other shape's);
- ``derivation``: how a bound is derived from measured error, shared by both kinds of bounds;
- ``rows``: a target's run of a request against the reference's, item by item, judged by them;
- ``features``: what a processor hands each tower against the reference's, item by item;
- ``cache``: the reference as the oracle of a run, its answers about requests kept on disk for
  later runs (keyed by its code, the variant, the serving options and the request);
- ``language_model``: the reference's language model as an engine's oracle (log-probabilities
  of prompts and continuations, fp32, LoRA adapters applied);
- ``engine_bounds``: the bounds on an engine's log-probabilities, from measured error on every
  CPU family at once;
- ``decoding``: greedy decoding against the reference, tie-aware, and two answers compared.

May import: ``targets`` (vLLM's CPU runtime), ``inputs``, ``checkpoints``.
"""
