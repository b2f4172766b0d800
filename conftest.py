"""Root conftest: loads the harness's pytest plugin for every run from this tree."""

import os

# No model hub at run time: configs and tokenizers are built in code. (VLLM_TARGET_DEVICE is set
# by the vllm target itself, before its first import of vLLM.)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest_plugins = ("harness.plugin",)
