"""The GPU run: what runs on a machine with CUDA and no vLLM.

- ``kernels``: vLLM's Mamba kernels loaded alone, and their launch metadata;
- ``real_widths``: the reference's layers at the published widths;
- ``throughput``: their throughput against the GPU's peak;
- ``bundle``: vLLM's sources carried to a GPU machine;
- ``summary``: the run's summary page.

May import: ``model_files``, ``environment``; nothing else of the harness (the GPU machine has no
vLLM).
"""
