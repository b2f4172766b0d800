"""The process environment every run of the harness needs, defined once.

No model hub at run time (configs, tokenizers and weights are made by our code), and vLLM on the
CPU unless told otherwise (its platform is chosen at its first import). ``noxfile.py`` reads
this file with ``runpy`` (nox runs without the harness installed); the root ``conftest.py`` and
the vLLM target apply it with :func:`apply`. No imports beyond the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: No network: the hubs are never asked.
OFFLINE: dict[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: What vLLM needs on a CPU-only host, set before its first import.
CPU: dict[str, str] = {"VLLM_TARGET_DEVICE": "cpu", **OFFLINE}


def apply(variables: Mapping[str, str]) -> None:
    """Set each variable the caller has not set already."""
    for name, value in variables.items():
        os.environ.setdefault(name, value)
