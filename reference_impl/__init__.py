"""A readable PyTorch reference implementation of Nano-Nemotron VL.

The model vLLM serves as ``NemotronH_Nano_VL_V2``.

Written from the published architecture brief; no vLLM imports, no pytest. One file per question:

- ``config``: the configuration dataclasses; ``errors``: the one error shape (field, expected,
  actual); ``presets``: the published shapes and every CPU-sized config tests build on;
  ``shrink``: a real config shrunk to its minimal layers.
- ``nemotron_h``: the hybrid language model (one mixer per pattern letter); ``ssd``: the Mamba2
  scan; ``layers``: small shared blocks; ``mamba_state``: one sequence's Mamba state shape and
  dtype from a config; ``weights``: the language model's loader (NemotronH weights in
  checkpoint or transformers naming); ``lora``: LoRA on the language model only; ``adapters``:
  LoRA adapter folders as PEFT saves them.
- ``radio``: the RADIO vision tower; ``audio``: features and the Parakeet tower; ``connector``:
  pixel shuffle and ``mlp1``; ``evs``: EVS video pruning; ``media``: a video file's audio
  track (PyAV); ``resample``: audio at another rate brought to the model's (band-limited
  interpolation).
- ``inputs``: the typed multimodal input contracts and their runtime validation; ``tokenizer``:
  a small fast tokenizer with the model's special tokens, built in code (no hub).
- ``tiling``: images and frames to tiles or patch grids (counts, sizes, pixels);
  ``video_replacement``: the tokens one ``<video>`` becomes (frame separators, tags, context
  tokens); ``processor``: the processor, prompt expansion and the model's inputs; ``metadata``:
  what an engine asks before any request, answered from the config alone.
- ``model``: the multimodal wrapper: parse and route inputs, ``embed_multimodal``, merge;
  ``checkpoint``: the checkpoint folder (``config.json``, checkpoint naming both ways, loading a
  whole checkpoint).
"""
