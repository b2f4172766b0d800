"""A readable PyTorch reference implementation of Nano-Nemotron VL.

The model vLLM serves as ``NemotronH_Nano_VL_V2``.

Written from the published architecture brief; no vLLM imports, no pytest. One file per question:

- ``config``: the configuration dataclasses; ``errors``: the one error shape (field, expected,
  actual); ``presets``: the published shapes and every CPU-sized config tests build on;
  ``shrink``: a real config shrunk to its minimal layers.
- ``nemotron_h``: the hybrid language model (one mixer per pattern letter); ``ssd``: the Mamba2
  scan; ``layers``: small shared blocks; ``mamba_state``: one sequence's Mamba state shape and
  dtype from a config; ``weights``: loading NemotronH weights; ``lora``: LoRA on the language
  model only; ``adapters``: LoRA adapter folders as PEFT saves them.
- ``radio``: the RADIO vision tower; ``audio``: features and the Parakeet tower; ``connector``:
  pixel shuffle and ``mlp1``; ``evs``: EVS video pruning; ``media``: a video file's audio
  track (PyAV).
- ``inputs``: the typed multimodal input contracts and their runtime validation; ``tokenizer``:
  a small fast tokenizer with the model's special tokens, built in code (no hub);
  ``processor``: the processor's arithmetic (tiles, frames, audio tokens, replacement ids).
- ``model``: the multimodal wrapper: parse and route inputs, ``embed_multimodal``, merge;
  ``checkpoint``: the checkpoint folder (``config.json`` and weights in checkpoint naming).
"""
