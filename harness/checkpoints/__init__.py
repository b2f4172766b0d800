"""What is served: a checkpoint variant, its folder, and the options it is served with.

- ``spec``: :class:`~.spec.ModelSpec`, a variant of the tiny checkpoint, and its reference config;
- ``pairs``: the variants of an all-pairs covering array over the options (every pair of two
  options' values in some variant);
- ``writer``: the folder (config, tokenizer, weights) written from the reference;
- ``cache``: each folder written once per process, or once per run for every process it starts
  (torch-free until a folder is written);
- ``cli``: ``nemotron-vl-checkpoint DIR``, a folder and LoRA adapters for a person;
- ``lora_adapters``: LoRA adapter folders, as PEFT saves them;
- ``weight_streams``: tensors streamed as weight loaders stream them;
- ``serving``: serving configurations, the options of ``vllm serve`` a user sets (an axis
  beside the checkpoint variant).

May import: ``reference_impl`` and nothing else of the harness but ``ROOT``.
"""
