"""``nemotron-vl-checkpoint DIR``: a tiny checkpoint folder for a person, and LoRA adapters for it.

The findings' reproductions run against such a folder with vLLM alone::

    nemotron-vl-checkpoint DIR [--dynamic] [--max-model-len N] [--checkpoint-dtype D]
                               [--video-aspect-patches N] [--adapter NAME ADIR ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.checkpoints.cache import reading_folder
from harness.checkpoints.lora_adapters import (
    BROKEN_FOR_MAX_LORA_RANK,
    adapter_names,
    write_adapter_folder,
)
from harness.checkpoints.spec import CHECKPOINT_DTYPES, ModelSpec
from harness.checkpoints.writer import write_checkpoint


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``nemotron-vl-checkpoint DIR [--dynamic] [--max-model-len N] [--checkpoint-dtype D]
    [--video-aspect-patches N] [--adapter NAME ADIR]``: write the tiny checkpoint folder into
    ``DIR`` (and each named LoRA adapter's folder for it into its ``ADIR``), and print each
    folder's path, one a line."""
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-checkpoint",
        description="Write a tiny Nano-Nemotron VL checkpoint folder that vLLM reads as it reads "
        "a real one (config.json with its configuration module, tokenizer, random bf16 or fp32 "
        "model.safetensors), and LoRA adapter folders for it.",
    )
    parser.add_argument("folder", type=Path, metavar="DIR", help="the checkpoint folder to write")
    parser.add_argument(
        "--dynamic", action="store_true", help="dynamic-resolution images (default: static tiles)"
    )
    default_len = ModelSpec().max_model_len
    parser.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=default_len,
        metavar="N",
        help=f"the context the config states (max_sequence_length; default {default_len})",
    )
    parser.add_argument(
        "--checkpoint-dtype",
        choices=sorted(CHECKPOINT_DTYPES),
        default=ModelSpec().checkpoint_dtype,
        help="the dtype the weights are saved in, and the config's torch_dtype (default: "
        "%(default)s; vLLM's --dtype auto serves a float32 checkpoint in bfloat16)",
    )
    parser.add_argument(
        "--video-aspect-patches",
        type=_positive_int,
        default=None,
        metavar="N",
        help="resize video frames to about N patches keeping their aspect ratio "
        "(vision_config.video_target_num_patches = N, video_maintain_aspect_ratio = true; "
        "default: each frame to a tile's side)",
    )
    default_width = ModelSpec().hidden_size
    parser.add_argument(
        "--hidden-size",
        type=_positive_int,
        default=default_width,
        metavar="N",
        help=f"the language model's width (default {default_width}; vLLM's CPU attention, "
        "which the CPU build's engine serves with, needs heads 32 wide or more: 128)",
    )
    parser.add_argument(
        "--adapter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "ADIR"),
        help="also write LoRA adapter NAME for this checkpoint into ADIR (repeatable); NAME is one "
        f"of {', '.join(adapter_names())} (broken-*: broken for --max-lora-rank "
        f"{BROKEN_FOR_MAX_LORA_RANK})",
    )
    args = parser.parse_args(argv)
    names = adapter_names()
    for name, _ in args.adapter:
        if name not in names:
            parser.error(f"argument --adapter: NAME: expected one of {names}, got {name!r}")
    if args.hidden_size % 16:
        parser.error(
            f"argument --hidden-size: expected a multiple of 16, got {args.hidden_size} (four "
            "attention heads, each a multiple of 4 wide)"
        )
    folders = [args.folder, *(Path(d) for _, d in args.adapter)]
    for path in folders:
        if path.exists() and not path.is_dir():
            parser.error(f"{str(path)!r} exists and is not a folder")
    try:
        spec = ModelSpec(
            dynamic_resolution=args.dynamic,
            max_model_len=args.max_model_len,
            checkpoint_dtype=args.checkpoint_dtype,
            video_target_num_patches=args.video_aspect_patches,
            video_maintain_aspect_ratio=args.video_aspect_patches is not None,
            hidden_size=args.hidden_size,
        )
    except ValueError as e:
        parser.error(str(e))
    folder = write_checkpoint(spec, args.folder).resolve()
    print(folder)
    with reading_folder(spec, folder):  # the adapters read this folder's tensors
        for name, adapter_dir in args.adapter:
            print(write_adapter_folder(spec, name, Path(adapter_dir)).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
