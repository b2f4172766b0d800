"""Shared set-up of the findings' reproductions: vLLM's multimodal processor for a tiny
Nano-Nemotron VL checkpoint folder, made the way ``vllm serve FOLDER`` makes it (no hub: the
folder's config, tokenizer and random bf16 weights are written by the harness).

Run a reproduction from the repository root, with vLLM installed::

    VLLM_TARGET_DEVICE=cpu python reports/findings/request_image_embeds.py

It prints ``REPRODUCED: <exception>`` and exits 0 while vLLM has the bug, and exits 1 once the
request goes through.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HIDDEN_SIZE = 64  # the tiny checkpoint's text_config.hidden_size


def processor(dynamic_resolution: bool = False, max_model_len: int = 4096) -> Any:
    """vLLM's registry processor for the tiny checkpoint folder."""
    from harness.checkpoint import ModelSpec, checkpoint_folder

    spec = ModelSpec(dynamic_resolution=dynamic_resolution, max_model_len=max_model_len)
    folder = checkpoint_folder(spec)
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(
        model=str(folder),
        tokenizer=str(folder),
        trust_remote_code=True,
        enable_mm_embeds=True,  # accept precomputed embeddings, as --enable-mm-embeds does
        max_model_len=max_model_len,
    )
    return MULTIMODAL_REGISTRY.create_processor(config)


def reproduce_silent(wrong: Callable[[], str | None]) -> int:
    """Run ``wrong``, which processes a request and says what is wrong with what it made: 0
    (and that) while something is, 1 once nothing is. For bugs that raise nothing."""
    problem = wrong()
    if problem is not None:
        print(f"REPRODUCED: {problem}"[:600])
        return 0
    print("NOT REPRODUCED: the request was processed right")
    return 1


def reproduce(request: Callable[[], object]) -> int:
    """Run ``request``: 0 (and the exception) when it fails, 1 when it succeeds."""
    try:
        request()
    except Exception as e:
        traceback.print_exc()
        print(f"REPRODUCED: {type(e).__name__}: {e}"[:600])
        return 0
    print("NOT REPRODUCED: the request was processed")
    return 1
