"""A readable PyTorch reference implementation of Nano-Nemotron VL.

The model vLLM serves as ``NemotronH_Nano_VL_V2``.

Written from the published architecture brief; no vLLM imports, no pytest. One file per question:

- ``config``: the configuration dataclasses.
- ``inputs``: the typed multimodal input contracts and their runtime validation.
- ``connector``: pixel shuffle and the ``mlp1`` vision-to-language projection.
- ``tokenizer``: a small fast tokenizer with the model's special tokens, built in code (no hub).
- ``processor``: prompt-side helpers (video frame separators and replacement token ids).
- ``model``: the multimodal wrapper: parse and route inputs, ``embed_multimodal``, merge.
"""
