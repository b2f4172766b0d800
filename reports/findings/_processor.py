"""Shared set-up of the findings' reproductions: vLLM's multimodal processor, or its model (with
serving options such as ``--dtype``, or with its LoRA manager), for a tiny Nano-Nemotron VL
checkpoint folder, made the way ``vllm serve FOLDER`` makes them (no hub: the folder holds its
config, configuration module, tokenizer and random bf16, or fp32, weights).

A reproduction runs against folders given on its command line, with vLLM alone (and torch,
numpy, PIL, PyAV, safetensors: no module of this repository is imported). One command of the
harness writes them, from the repository root::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    VLLM_TARGET_DEVICE=cpu python reports/findings/request_image_embeds.py /tmp/nnvl-tiny

A finding that needs another folder (dynamic resolution, a shorter context, fp32 weights, LoRA
adapters) says so in its docstring and its issue text; run with ``--help`` or a wrong folder, a
script prints the exact writer command. Given no folder (``python reports/findings/X.py``, or
``nemotron-vl-findings``, which calls each ``main()``), a script has the harness write the
folders it needs into a temporary folder first.

A script prints ``REPRODUCED: <what is wrong>`` and exits 0 while vLLM has the bug, exits 1 once
the request goes through, and exits 2 on a wrong command line.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HIDDEN_SIZE = 64  # the tiny checkpoint's text_config.hidden_size
DEFAULT_MAX_MODEL_LEN = 4096  # the context the default folder's config states
BROKEN_PREFIX = "broken-"  # the writer's name of a broken adapter: broken-<kind>
DEFAULT_CHECKPOINT_DTYPE = "bfloat16"  # the dtype the default folder's weights are saved in
DTYPE_SHORT_NAMES = {"bfloat16": "bf16", "float32": "fp32"}  # in the printed folder names


# ---------------------------------------------------------------------------------------------
# The folders


@dataclass(frozen=True)
class Folders:
    """The folders a reproduction runs against: a checkpoint folder (``dynamic``: dynamic
    resolution; ``max_model_len``: the context its config states; ``checkpoint_dtype``: the
    dtype its weights are saved in, its config's ``torch_dtype``) and LoRA adapter folders for
    it, by the names ``nemotron-vl-checkpoint --adapter NAME DIR`` writes them under;
    ``video_aspect_patches``: video frames resized to about that many patches keeping their
    aspect ratio (``vision_config.video_target_num_patches``, ``video_maintain_aspect_ratio``);
    ``hidden_size``: the language model's width (128 for vLLM's CPU attention, whose heads must
    be 32 wide or more: the engine's findings)."""

    dynamic: bool = False
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    adapters: tuple[str, ...] = ()
    checkpoint_dtype: str = DEFAULT_CHECKPOINT_DTYPE
    video_aspect_patches: int | None = None
    hidden_size: int = HIDDEN_SIZE

    @property
    def checkpoint_path(self) -> str:
        """Where the commands printed for a person put the checkpoint folder."""
        path = "/tmp/nnvl-tiny" + ("-dynamic" if self.dynamic else "")
        path += "" if self.max_model_len == DEFAULT_MAX_MODEL_LEN else f"-{self.max_model_len}"
        return (
            path
            + (
                ""
                if self.checkpoint_dtype == DEFAULT_CHECKPOINT_DTYPE
                else f"-{DTYPE_SHORT_NAMES.get(self.checkpoint_dtype, self.checkpoint_dtype)}"
            )
            + ("" if self.video_aspect_patches is None else "-video-aspect")
            + ("" if self.hidden_size == HIDDEN_SIZE else f"-d{self.hidden_size}")
        )

    def adapter_path(self, name: str) -> str:
        return f"/tmp/nnvl-lora/{name.removeprefix(BROKEN_PREFIX)}"

    def writer_command(self) -> str:
        """The command that writes these folders (from the repository root)."""
        words = ["nemotron-vl-checkpoint", self.checkpoint_path]
        if self.dynamic:
            words.append("--dynamic")
        if self.max_model_len != DEFAULT_MAX_MODEL_LEN:
            words.append(f"--max-model-len {self.max_model_len}")
        if self.checkpoint_dtype != DEFAULT_CHECKPOINT_DTYPE:
            words.append(f"--checkpoint-dtype {self.checkpoint_dtype}")
        if self.video_aspect_patches is not None:
            words.append(f"--video-aspect-patches {self.video_aspect_patches}")
        if self.hidden_size != HIDDEN_SIZE:
            words.append(f"--hidden-size {self.hidden_size}")
        words += [f"--adapter {name} {self.adapter_path(name)}" for name in self.adapters]
        return " ".join(words)

    def script_command(self, script: str) -> str:
        """The command that runs ``script`` against them."""
        folders = [self.checkpoint_path, *map(self.adapter_path, self.adapters)]
        return " ".join(["python", script, *folders])

    def resolve(self, argv: Sequence[str] | None, script: str) -> tuple[Path, list[Path]]:
        """The checkpoint folder and the adapter folders: those ``argv`` names, checked to be
        the variant this finding needs; the harness's, written now, when ``argv`` is empty."""
        if not argv:
            return self._written_by_the_harness()
        name = f"reports/findings/{Path(script).name}"
        parser = argparse.ArgumentParser(
            prog=f"python {name}",
            description=f"Reproduce the finding of {name} against the folders written by: "
            f"{self.writer_command()}",
            epilog=f"for example: {self.script_command(name)}",
        )
        parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT")
        for adapter in self.adapters:
            parser.add_argument(
                adapter.replace("-", "_"),
                type=Path,
                metavar=adapter.upper().replace("-", "_"),
                help=f"the folder of adapter {adapter}",
            )
        args = parser.parse_args(argv)
        checkpoint: Path = args.checkpoint
        self._check_checkpoint(checkpoint, parser)
        adapters: list[Path] = [getattr(args, a.replace("-", "_")) for a in self.adapters]
        for adapter, folder in zip(self.adapters, adapters, strict=True):
            if not (folder / "adapter_config.json").is_file():
                parser.error(
                    f"{str(folder)!r} holds no adapter_config.json: not adapter {adapter}'s "
                    f"folder; write it with: {self.writer_command()}"
                )
        return checkpoint, adapters

    def _check_checkpoint(self, folder: Path, parser: argparse.ArgumentParser) -> None:
        write = f"write it with: {self.writer_command()}"
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as e:
            parser.error(f"{str(folder)!r} is not a checkpoint folder ({e}); {write}")
        dynamic = "min_num_patches" in config.get("vision_config", {}).get("args", {})
        if dynamic != self.dynamic:
            parser.error(
                f"{str(folder)!r} has {'dynamic' if dynamic else 'static'}-resolution images; "
                f"this finding needs {'dynamic' if self.dynamic else 'static'} ones: {write}"
            )
        if config.get("max_sequence_length") != self.max_model_len:
            parser.error(
                f"{str(folder)!r} states a context of {config.get('max_sequence_length')} "
                f"tokens; this finding needs {self.max_model_len}: {write}"
            )
        saved = config.get("torch_dtype", config.get("dtype"))
        if saved != self.checkpoint_dtype:
            parser.error(
                f"{str(folder)!r} is saved in {saved}; this finding needs a checkpoint saved in "
                f"{self.checkpoint_dtype}: {write}"
            )
        vision = config.get("vision_config", {})
        aspect = vision.get("video_target_num_patches")
        aspect = aspect if vision.get("video_maintain_aspect_ratio") else None
        if aspect != self.video_aspect_patches:
            parser.error(
                f"{str(folder)!r} resizes video frames to {_frame_target(aspect)}; this finding "
                f"needs {_frame_target(self.video_aspect_patches)}: {write}"
            )
        width = config.get("text_config", {}).get("hidden_size")
        if width != self.hidden_size:
            parser.error(
                f"{str(folder)!r} has a language model {width} wide; this finding needs "
                f"{self.hidden_size}: {write}"
            )

    def _written_by_the_harness(self) -> tuple[Path, list[Path]]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from harness.checkpoints.cache import checkpoint_folder
        from harness.checkpoints.lora_adapters import write_adapter_folder
        from harness.checkpoints.spec import ModelSpec

        spec = ModelSpec(
            dynamic_resolution=self.dynamic,
            max_model_len=self.max_model_len,
            checkpoint_dtype=self.checkpoint_dtype,  # type: ignore[arg-type]
            video_target_num_patches=self.video_aspect_patches,
            video_maintain_aspect_ratio=self.video_aspect_patches is not None,
            hidden_size=self.hidden_size,
        )
        adapters: list[Path] = []
        if self.adapters:
            root = Path(tempfile.mkdtemp(prefix="nnvl-lora-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            adapters = [
                write_adapter_folder(spec, a, root / a.removeprefix(BROKEN_PREFIX))
                for a in self.adapters
            ]
        return checkpoint_folder(spec), adapters


def _frame_target(patches: int | None) -> str:
    return "a tile" if patches is None else f"about {patches} patches keeping their aspect ratio"


def stated_context(folder: Path) -> int:
    """The context the checkpoint folder's config states: ``--max-model-len``."""
    return int(json.loads((folder / "config.json").read_text())["max_sequence_length"])


def processor(folder: Path) -> Any:
    """vLLM's registry processor for the checkpoint ``folder``."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(
        model=str(folder),
        tokenizer=str(folder),
        trust_remote_code=True,
        enable_mm_embeds=True,  # accept precomputed embeddings, as --enable-mm-embeds does
        max_model_len=stated_context(folder),
    )
    return MULTIMODAL_REGISTRY.create_processor(config)


# ---------------------------------------------------------------------------------------------
# The model and its LoRA manager, on the CPU

_RUNTIME: list[object] = []


def _lift_triton_cpu_refusal() -> None:
    """vLLM 0.34.0's CPU platform refuses every config on an x86 CPU without Triton's CPU
    backend ("vLLM on x86 CPUs requires Triton (triton-cpu)."), a guard for its x86 model
    runner, which no reproduction here starts. Where the installed release has that refusal
    and this machine meets it, its config check runs with Triton reported present for that
    call alone; elsewhere (a GPU, an earlier release) nothing changes. Said on stderr."""
    import inspect

    from vllm import triton_utils
    from vllm.platforms import cpu

    check = cpu.CpuPlatform.check_and_update_config.__func__
    if "requires Triton (triton-cpu)" not in inspect.getsource(check) or triton_utils.HAS_TRITON:
        return

    def without_refusal(cls: type, vllm_config: Any) -> None:
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    cpu.CpuPlatform.check_and_update_config = classmethod(without_refusal)
    print(
        "(vLLM's refusal of x86 CPUs without triton-cpu lifted for its config check)",
        file=sys.stderr,
    )


def _init_cpu_runtime() -> None:
    """Once per process: a current ``VllmConfig``, a one-process gloo group and model-parallel
    groups, which vLLM's parallel layers look up when they are built."""
    if _RUNTIME:
        return
    _lift_triton_cpu_refusal()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    context = set_current_vllm_config(VllmConfig())
    context.__enter__()
    handle, path = tempfile.mkstemp(prefix="vllm-dist-")
    os.close(handle)
    os.unlink(path)
    init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{path}", local_rank=0, backend="gloo"
    )
    initialize_model_parallel(1, 1)
    _RUNTIME.append(context)


@contextlib.contextmanager
def told() -> Iterator[list[str]]:
    """What vLLM says meanwhile: its log records at WARNING or above, and Python warnings."""

    class Handler(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    handler = Handler()
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield handler.messages
    finally:
        logger.removeHandler(handler)
    handler.messages += [str(w.message) for w in caught]


@contextlib.contextmanager
def without_packed_cpu_kernels() -> Iterator[None]:
    """vLLM's post-load processing as on a CPU without AVX512-BF16 and AMX, whose packed-weight
    kernels (causal_conv1d_weight_pack, convert_weight_packed) vLLM's CUDA wheel lacks."""
    import torch

    with (
        mock.patch.object(torch.cpu, "_is_avx512_bf16_supported", return_value=False),
        mock.patch.object(torch.cpu, "_is_amx_tile_supported", return_value=False),
    ):
        yield


class Served:
    """The checkpoint folder's model as ``vllm serve FOLDER *options`` serves it, on the CPU.

    The engine config is made as the command makes it: ``options`` (with ``--trust-remote-code``
    and the context the folder's config states) parsed by vLLM's own argument parser
    (``EngineArgs.add_cli_args``), then ``EngineArgs.from_cli_args(...).create_engine_config()``.
    The model is then built as vLLM's loader builds it: its constructor under the served dtype,
    ``load_weights`` from the folder's safetensors, post-load processing. :meth:`run` sends one
    request through the registry processor and the model runner's encoder step."""

    def __init__(self, folder: Path, options: Sequence[str] = ()) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        _init_cpu_runtime()
        args = [f"--model={folder}", f"--tokenizer={folder}", "--trust-remote-code"]
        args += [f"--max-model-len={stated_context(folder)}", *options]
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        self.vllm_config = EngineArgs.from_cli_args(parser.parse_args(args)).create_engine_config()
        model_config = self.vllm_config.model_config
        model = built_model(self.vllm_config)
        self.model = model.eval()
        self.dtype: Any = model_config.dtype  # the served dtype (--dtype)
        self.processor = MULTIMODAL_REGISTRY.create_processor(model_config)

    def run(
        self,
        prompt: str,
        data: dict[str, object],
        processor_kwargs: dict[str, object] | None = None,
    ) -> list[Any]:
        """One request's media embeddings, in prompt order, as the engine makes them: the
        registry processor (its context casts the features to the served dtype), each item's
        kwargs through vLLM's msgpack encoder and decoder, ``group_and_batch_mm_kwargs``, the
        model's ``embed_multimodal`` per batch, ``sanity_check_mm_encoder_outputs``."""
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.multimodal.inputs import MultiModalKwargsItem
        from vllm.multimodal.utils import group_and_batch_mm_kwargs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
        from vllm.v1.worker.utils import sanity_check_mm_encoder_outputs

        items = self.processor.info.parse_mm_data(data)
        processed = self.processor(prompt, items, hf_processor_mm_kwargs=processor_kwargs or {})
        placed = sorted(
            (placeholder.offset, modality, index)
            for modality, placeholders in processed["mm_placeholders"].items()
            for index, placeholder in enumerate(placeholders)
        )
        encoder, decoder = MsgpackEncoder(), MsgpackDecoder(MultiModalKwargsItem)
        kwargs = [
            (modality, decoder.decode(encoder.encode(processed["mm_kwargs"][modality][index])))
            for _, modality, index in placed
        ]
        # Videos one at a time where the model asks for it, as the model runner batches them.
        sequential = getattr(self.model, "requires_sequential_video_encoding", False)
        batches: list[tuple[int, Any]] = []
        done = 0  # items batched so far
        for modality, num_items, batch in group_and_batch_mm_kwargs(kwargs):
            if sequential and modality == "video" and num_items > 1:
                for one in kwargs[done : done + num_items]:
                    batches.append((1, next(group_and_batch_mm_kwargs([one]))[2]))
            else:
                batches.append((num_items, batch))
            done += num_items
        outputs: list[Any] = []
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            for num_items, batch in batches:
                out = self.model.embed_multimodal(**batch)
                sanity_check_mm_encoder_outputs(out, expected_num_items=num_items)
                outputs.extend(out)
        return outputs


def built_model(vllm_config: Any) -> Any:
    """The model of ``vllm_config`` as vLLM's loader makes it: its constructor (default dtype
    the served one, on the CPU), ``load_weights`` from the folder, post-load processing."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_config = vllm_config.model_config
    loader = get_model_loader(vllm_config.load_config)
    with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
        model = loader.create_model(vllm_config=vllm_config, model_config=model_config)
    with set_current_vllm_config(vllm_config):
        loader.load_weights(model, model_config)
    with without_packed_cpu_kernels(), set_current_vllm_config(vllm_config):
        process_weights_after_loading(model, model_config, torch.device("cpu"))
    return model


class ServedWithLoRA:
    """The checkpoint folder's model as ``vllm serve FOLDER --enable-lora --max-loras 2
    --max-lora-rank R`` serves it, on the CPU: vLLM's constructor, loader and post-load
    processing, then the model runner's LoRA steps (``LRUCacheWorkerLoRAManager`` and its
    ``create_lora_manager``; per adapter ``add_adapter(LoRARequest)`` and
    ``set_active_adapters``)."""

    def __init__(self, folder: Path, max_lora_rank: int = 8, max_loras: int = 2) -> None:
        import torch
        from vllm.config import (
            DeviceConfig,
            LoadConfig,
            LoRAConfig,
            ModelConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

        _init_cpu_runtime()
        model_config = ModelConfig(
            model=str(folder),
            tokenizer=str(folder),
            trust_remote_code=True,
            enable_mm_embeds=True,
            max_model_len=stated_context(folder),
        )
        self.vllm_config = VllmConfig(
            model_config=model_config,
            device_config=DeviceConfig("cpu"),
            load_config=LoadConfig(),
            lora_config=LoRAConfig(max_loras=max_loras, max_lora_rank=max_lora_rank),
        )
        model = built_model(self.vllm_config)
        model.eval()
        with set_current_vllm_config(self.vllm_config):
            self.worker = LRUCacheWorkerLoRAManager(
                self.vllm_config, torch.device("cpu"), model.embedding_modules
            )
            self.model = self.worker.create_lora_manager(model, self.vllm_config)
        self.manager = self.worker._adapter_manager

    def add(self, adapter_id: int, folder: Path) -> tuple[list[str], list[str]]:
        """Load the adapter in ``folder`` and activate it for one token; returns the vLLM
        modules its slot put weights into, and what vLLM said (warnings, WARNING records)."""
        from vllm.config import set_current_vllm_config
        from vllm.lora.layers import LoRAMapping
        from vllm.lora.request import LoRARequest

        request = LoRARequest(folder.name, adapter_id, str(folder))
        with told() as messages, set_current_vllm_config(self.vllm_config):
            self.worker.add_adapter(request)
            mapping = LoRAMapping((adapter_id,), (adapter_id,), is_prefill=True)
            self.worker.set_active_adapters({request}, mapping)
        return self.applied(adapter_id), list(messages)

    def applied(self, adapter_id: int) -> list[str]:
        """vLLM's LoRA layers whose slot for ``adapter_id`` holds non-zero weights."""
        slot = self.manager.lora_index_to_id.index(adapter_id)
        names = []
        for name, layer in self.manager.modules.items():
            stacked = getattr(layer, "lora_b_stacked", None)
            if stacked is None:
                continue
            slices = stacked if isinstance(stacked, tuple | list) else (stacked,)
            if any(bool(weights[slot].abs().sum() > 0) for weights in slices):
                names.append(name)
        return sorted(names)


# ---------------------------------------------------------------------------------------------
# Media


@dataclass(frozen=True)
class VideoFile:
    """A Matroska file's bytes, its frames decoded back, and vLLM's video metadata for them
    (``original_video_bytes`` too, as vLLM's ``nemotron_vl`` video loader keeps them)."""

    frames: np.ndarray
    data: bytes

    def metadata(self) -> dict[str, object]:
        total = len(self.frames)
        return {
            "fps": 2.0,
            "frames_indices": list(range(total)),
            "total_num_frames": total,
            "duration": total / 2.0,
            "video_backend": "opencv",
            "original_video_bytes": self.data,
        }


def video_file(audio_seconds: float, audio_rate: int = 16000, audio_channels: int = 1) -> VideoFile:
    """Two 64 x 64 noise frames at 2 fps (MPEG-4 Part 2) and a 440 Hz tone of ``audio_seconds``
    (16-bit PCM at ``audio_rate``; mono, or the tone in both channels of stereo), made with
    PyAV."""
    import av

    layout = "mono" if audio_channels == 1 else "stereo"
    frames = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    buffer = BytesIO()
    with av.open(buffer, "w", format="matroska") as container:
        video = container.add_stream("mpeg4", rate=2)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        audio = container.add_stream("pcm_s16le", rate=audio_rate, layout=layout)
        for index, array in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        samples = round(audio_seconds * audio_rate)
        t = np.arange(samples) / audio_rate
        tone = (0.3 * 32767 * np.sin(2 * np.pi * 440.0 * t)).astype(np.int16)
        pcm = np.repeat(tone, audio_channels)[None]  # packed: the channels interleaved in a row
        for start in range(0, samples, 1024):
            chunk = av.AudioFrame.from_ndarray(
                pcm[:, start * audio_channels : (start + 1024) * audio_channels],
                format="s16",
                layout=layout,
            )
            chunk.sample_rate, chunk.pts = audio_rate, start
            container.mux(audio.encode(chunk))
        container.mux(audio.encode(None))
    data = buffer.getvalue()
    with av.open(BytesIO(data), "r") as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return VideoFile(np.stack(decoded), data)


AUDIO_RATE = 16000  # the sampling rate of the audio items (the feature extractor's)


def one_item_requests() -> dict[str, tuple[str, dict[str, object]]]:
    """One request per modality, as ``(prompt, multi-modal data)``: a 64 x 64 noise image
    (PIL), a two-frame 64 x 64 video (:func:`video_file`'s frames and metadata), a one-second
    440 Hz tone at 16 kHz."""
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    video = video_file(1.0)
    t = np.arange(AUDIO_RATE) / AUDIO_RATE
    tone = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    return {
        "image": ("<image>", {"image": [Image.fromarray(pixels)]}),
        "video": ("<video>", {"video": [(video.frames, video.metadata())]}),
        "audio": ("<so_embedding>", {"audio": [(tone, AUDIO_RATE)]}),
    }


# ---------------------------------------------------------------------------------------------
# Verdicts


def served_request_problems(served: Served, modalities: Sequence[str]) -> list[str]:
    """What goes wrong with one request of each of ``modalities`` (:func:`one_item_requests`)
    to ``served``: ``"<modality>: <exception type>: <message>"`` for one that raised (its
    traceback printed), ``"<modality>: embeddings in <dtype>, not the served <dtype>"`` for one
    whose embeddings are not in the served dtype; ``[]`` when every one is right."""
    requests = one_item_requests()
    problems = []
    for modality in modalities:
        prompt, data = requests[modality]
        try:
            outputs = served.run(prompt, data)
        except Exception as e:
            traceback.print_exc()
            problems.append(f"{modality}: {type(e).__name__}: {e}")
            continue
        dtypes = sorted({str(output.dtype) for output in outputs})
        if dtypes != [str(served.dtype)]:
            problems.append(
                f"{modality}: embeddings in {', '.join(dtypes)}, not the served {served.dtype}"
            )
    return problems


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
