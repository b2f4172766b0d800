"""What the checks send a target.

- ``requests``: a user's multimodal request and what an engine makes of it (types only; each
  target's adapter writes the request in its engine's form);
- ``media``: images, video clips and files, audio and embedding rows, from a seed;
- ``catalogue``: every request form a user can send, on the checkpoint variant it needs, and the
  content pairs of each tower path;
- ``model_kwargs``: builders of valid multimodal keyword arguments for ``embed_multimodal``;
- ``strategies``: hypothesis strategies over both, and over serving configurations;
- ``drawn``: requests drawn from a seed per parity path, for calibrating its bounds;
- ``shapes``: the request shapes a known vLLM bug reaches, by which a drawn request's failure is
  recognised as that bug's.

May import: ``checkpoints``.
"""
