"""vLLM builds and loads a checkpoint folder as it does for a user, on CPU.

- :func:`engine_config`: the ``VllmConfig`` of ``vllm serve FOLDER`` with a serving
  configuration's options (:mod:`harness.checkpoints.serving`), through vLLM's own argument parser
  and ``EngineArgs`` (offline, the context the folder's config states, ``trust_remote_code`` for
  its configuration module; every modality limit 0 for text-only; ``hf_overrides`` as given).
- :func:`load_stream`: vLLM's loader fed a stream of checkpoint tensors.
- :func:`build_and_load`: the model class from vLLM's registry (checked to be the class of the
  file under test), then the steps of vLLM's ``BaseModelLoader.load_model``: its constructor
  (``create_model``), ``DefaultModelLoader.load_weights`` reading the folder's safetensors, and
  ``process_weights_after_loading``; each step timed.
- :func:`expected_parameter`: which checkpoint tensor each vLLM parameter must hold (facts about
  vLLM's naming: fused q/k/v, ``A = -exp(A_log)``, the padded vocabulary, RADIO's renamed blocks,
  the sound projection's names).
"""

from __future__ import annotations

import dataclasses
import json
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.targets.base import LoRAOptions, NeedsCuda, TargetLoadError
from harness.targets.vllm.runtime import init_cpu_runtime, without_packed_cpu_kernels

#: Modalities whose limits a text-only engine sets to 0.
MODALITIES = ("image", "video", "audio")
MAX_MODEL_LEN = 4096


@dataclass
class Timings:
    """Seconds spent in each step of building one model."""

    config_s: float = 0.0
    construct_s: float = 0.0
    load_s: float = 0.0
    post_load_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "config_s": round(self.config_s, 3),
            "construct_s": round(self.construct_s, 3),
            "load_s": round(self.load_s, 3),
            "post_load_s": round(self.post_load_s, 3),
        }


def engine_config(
    folder: Path,
    *,
    serving: ServingConfig = DEFAULT_SERVING,
    text_only: bool = False,
    hf_overrides: Mapping[str, Any] | None = None,
    mm_processor_kwargs: Mapping[str, Any] | None = None,
    video_pruning_rate: float = 0.0,
    lora: LoRAOptions | None = None,
) -> Any:
    """The ``VllmConfig`` of ``vllm serve FOLDER`` with ``serving``'s options, made as the
    command makes it: the options parsed by vLLM's own argument parser into ``EngineArgs``,
    then ``EngineArgs.create_engine_config``.

    The harness adds: ``--trust-remote-code`` (the folder's configuration module), the context
    the folder's config states unless ``serving`` sets one, ``--mm-processor-kwargs`` (the
    checkpoint variant's ``mm_processor_kwargs`` under ``serving``'s), ``--video-pruning-rate``
    (0 leaves vLLM's default None), ``--hf-overrides``, every modality limit 0 for
    ``text_only``, and ``--enable-lora --max-loras --max-lora-rank`` for ``lora``.
    """
    init_cpu_runtime()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # --max-model-len: the context the checkpoint's config states (its processor budgets for it).
    stated = json.loads((folder / "config.json").read_text()).get("max_sequence_length")
    args = [f"--model={folder}", f"--tokenizer={folder}", "--trust-remote-code"]
    if serving.max_model_len is None:
        args.append(f"--max-model-len={int(stated or MAX_MODEL_LEN)}")
    if text_only:
        serving = dataclasses.replace(serving, limit_mm_per_prompt=dict.fromkeys(MODALITIES, 0))
    processor_kwargs = {**dict(mm_processor_kwargs or {}), **serving.processor_kwargs()}
    if processor_kwargs:
        serving = dataclasses.replace(serving, mm_processor_kwargs=processor_kwargs)
    args += serving.cli_args()
    if hf_overrides:
        args.append(f"--hf-overrides={json.dumps(dict(hf_overrides))}")
    if video_pruning_rate != 0.0:
        args.append(f"--video-pruning-rate={video_pruning_rate!r}")
    if lora is not None:
        args += ["--enable-lora", f"--max-loras={lora.max_loras}"]
        args.append(f"--max-lora-rank={lora.max_lora_rank}")
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(args)).create_engine_config()


def check_registered_class(module: types.ModuleType, vllm_config: Any) -> None:
    """The class vLLM's registry resolves for the folder's architecture; it must be the class
    of the file under test (``vllm-file:`` targets replace the module the registry imports)."""
    from vllm.model_executor.model_loader import utils as loader_utils
    from vllm.model_executor.models import registry

    cls, arch = loader_utils.get_model_architecture(vllm_config.model_config)
    expected = module.NemotronH_Nano_VL_V2
    if cls is not expected:
        # vLLM caches the class it resolved, per folder and per architecture: one resolved
        # earlier in this process, or in the parent a child was forked from, can be the class
        # of a module replaced or imported again since. A fresh process resolves it afresh.
        getattr(loader_utils, "_MODEL_ARCH_BY_HASH", {}).clear()
        registry._try_load_model_cls.cache_clear()
        registry._try_inspect_model_cls.cache_clear()
        cls, arch = loader_utils.get_model_architecture(vllm_config.model_config)
    if cls is not expected:
        raise TargetLoadError(
            f"vLLM's registry resolved {arch!r} to {cls.__module__}.{cls.__qualname__}, not the "
            f"class of the file under test ({getattr(module, '__file__', '?')})"
        )


def construct(module: types.ModuleType, vllm_config: Any) -> Any:
    """vLLM's constructor for the registered class, as its loader calls it (default dtype the
    model's, parameters on the CPU); weights not loaded."""
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    check_registered_class(module, vllm_config)
    loader = get_model_loader(vllm_config.load_config)
    model_config = vllm_config.model_config
    try:
        with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
            return loader.create_model(vllm_config=vllm_config, model_config=model_config)
    except NotImplementedError as e:
        if "supported only for CUDA" in str(e):
            # NemotronH's MoE layers are non-gated; vLLM's FusedMoE refuses them on CPU.
            raise NeedsCuda(
                f"vLLM's constructor on CPU raised NotImplementedError: {e} (the vllm target "
                "runs on CPU only: checks of NemotronH's MoE layers wait for a CUDA vLLM target)"
            ) from e
        raise


def load_stream(model: Any, vllm_config: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """vLLM's ``DefaultModelLoader.load_weights`` with ``weights`` in place of the folder's
    safetensors iterator: the model's ``load_weights`` and the loader's own check of what it
    reports loaded both run."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    loader = get_model_loader(vllm_config.load_config)
    loader.get_all_weights = lambda model_config, model: weights
    loader.counter_before_loading_weights = time.perf_counter()
    with set_current_vllm_config(vllm_config):
        loader.load_weights(model, vllm_config.model_config)


def build_and_load(
    module: types.ModuleType,
    folder: Path,
    timings: Timings | None = None,
    mm_processor_kwargs: Mapping[str, Any] | None = None,
    video_pruning_rate: float = 0.0,
    lora: LoRAOptions | None = None,
    serving: ServingConfig = DEFAULT_SERVING,
) -> tuple[Any, Any]:
    """Build the folder's model with vLLM's constructor and load it with vLLM's loader, served
    with ``serving``'s options; returns the model and its ``VllmConfig``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    timings = timings if timings is not None else Timings()
    start = time.perf_counter()
    vllm_config = engine_config(
        folder,
        serving=serving,
        mm_processor_kwargs=mm_processor_kwargs,
        video_pruning_rate=video_pruning_rate,
        lora=lora,
    )
    timings.config_s = time.perf_counter() - start
    start = time.perf_counter()
    model = construct(module, vllm_config)
    timings.construct_s = time.perf_counter() - start
    start = time.perf_counter()
    model_config = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        get_model_loader(vllm_config.load_config).load_weights(model, model_config)
    timings.load_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        with without_packed_cpu_kernels(), set_current_vllm_config(vllm_config):
            process_weights_after_loading(model, model_config, torch.device("cpu"))
    except (AttributeError, RuntimeError) as e:
        # The CUDA wheel on a CPU lacks the op (AttributeError); the CPU build registers it
        # without its arguments (RuntimeError: "_C::static_scaled_fp8_quant() expected at most 0
        # argument(s)").
        if model_config.quantization == "fp8" and "_C" in str(e):
            raise NeedsCuda(
                f"vLLM's fp8 post-load step raised {type(e).__name__}: {e} (it needs vLLM's "
                "compiled CUDA ops, vllm._C, which a CPU install lacks: fp8 checkpoints serve on "
                "a CUDA vLLM target)"
            ) from e
        raise
    timings.post_load_s = time.perf_counter() - start
    return model.eval(), vllm_config


# ---------------------------------------------------------------------------------------------
# Which checkpoint tensor each vLLM parameter holds

#: Parameters vLLM's constructor initialises and its loader never loads, with the value the
#: architecture gives them: RADIO's layer scales are identity in these checkpoints (``ls1``
#: before vLLM 0.34.0, ``layer_scale1.lambda1`` from it on).
CONSTRUCTOR_INITIALISED = (".ls1", ".ls2", ".layer_scale1.lambda1", ".layer_scale2.lambda1")
#: vLLM 0.34.0 rebuilt the RADIO tower as Transformers' ``RadioModel`` tree (``embeddings.*``,
#: ``encoder.layer.N.*``, ``attention`` for ``attn``), mapping the checkpoints' remote-code
#: names onto it at load time (its ``RadioModel.hf_to_vllm_mapper``); earlier releases kept
#: the checkpoints' own tree under ``model.``. Each release's parameter names are its own, so
#: both trees are read here: the checkpoint tensor each parameter holds, by its embedding part.
RADIO_EMBEDDINGS = {
    "position_embedding": "pos_embed",
    "patch_projection.": "embedder.",
    "video_patch_projection.": "video_embedder.",
    "cls_register_token": "cls_token.token",
}


def checkpoint_name(name: str) -> str | None:
    """The checkpoint tensor a vLLM parameter or buffer is loaded from (before fusing); None
    for one with no checkpoint source."""
    if name.endswith(CONSTRUCTOR_INITIALISED) or name.endswith("num_batches_tracked"):
        return None
    if name.startswith("language_model.model."):
        rest = name.removeprefix("language_model.model.")
        rest = rest.replace("embed_tokens.", "embeddings.").replace("mixer.A", "mixer.A_log")
        return "language_model.backbone." + rest
    if name.startswith("language_model.lm_head."):
        return name
    if name.startswith("vision_model.model.patch_generator."):
        return "vision_model.radio_model." + name.removeprefix("vision_model.")
    if name.startswith("vision_model.model.encoder.layers."):
        return "vision_model.radio_model.model.blocks." + name.removeprefix(
            "vision_model.model.encoder.layers."
        )
    if name.startswith("vision_model.embeddings."):
        part = name.removeprefix("vision_model.embeddings.")
        for ours, theirs in RADIO_EMBEDDINGS.items():
            if part.startswith(ours):
                part = theirs + part.removeprefix(ours)
                return "vision_model.radio_model.model.patch_generator." + part
        return None
    if name.startswith("vision_model.encoder.layer."):
        rest = name.removeprefix("vision_model.encoder.layer.").replace(".attention.", ".attn.")
        return "vision_model.radio_model.model.blocks." + rest
    if name.startswith("vision_final_layernorm."):
        return "vision_projector." + name
    if name.startswith("mlp1."):
        return name
    if name.startswith("sound_encoder.projection."):
        return "sound_projection." + name.removeprefix("sound_encoder.projection.")
    if name.startswith("sound_encoder.encoder."):
        return name
    return None


def checkpoint_sources(name: str) -> tuple[str, ...]:
    """The checkpoint tensors vLLM's parameter ``name`` is made of: q, k and v for a fused
    projection, its :func:`checkpoint_name` otherwise; none for one with no checkpoint source."""
    source = checkpoint_name(name)
    if source is None:
        return ()
    if source.endswith("qkv_proj.weight"):
        return tuple(source.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj"))
    return (source,)


def expected_parameter(
    sources: tuple[str, ...], shape: torch.Size, checkpoint: Mapping[str, torch.Tensor]
) -> torch.Tensor | None:
    """The value a vLLM parameter of ``shape`` made of ``sources`` (its
    :func:`checkpoint_sources`) must hold after loading ``checkpoint``; None when it has no
    checkpoint source (then :data:`CONSTRUCTOR_INITIALISED` applies)."""
    if not sources:
        return None
    if len(sources) > 1:
        return torch.cat([checkpoint[source] for source in sources])
    (source,) = sources
    if source.endswith("mixer.A_log"):
        return -torch.exp(checkpoint[source].float())
    tensor = checkpoint[source]
    if source.endswith(("embeddings.weight", "lm_head.weight")) and shape[0] > tensor.shape[0]:
        padded = torch.zeros(shape, dtype=tensor.dtype)
        padded[: tensor.shape[0]] = tensor
        return padded  # rows past the vocabulary: the padding of vLLM's vocab-parallel layers
    return tensor


def main(argv: list[str] | None = None) -> int:
    """``nemotron-vl-build-vllm [--dynamic] [--t2] [--no-audio] [--mtp]``: build
    one variant's model in this fresh process and print the seconds each step took."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dynamic", action="store_true", help="dynamic-resolution images")
    parser.add_argument("--t2", action="store_true", help="video temporal patch 2")
    parser.add_argument("--no-audio", action="store_true", help="no audio tower")
    parser.add_argument("--mtp", action="store_true", help="MTP layers (vision_final_layernorm)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    from harness.checkpoints.cache import checkpoint_folder
    from harness.checkpoints.spec import ModelSpec
    from harness.model_files import MODEL_MODULE
    from harness.targets.vllm.runtime import import_vllm_module

    module = import_vllm_module(MODEL_MODULE)
    imported = time.perf_counter() - start
    spec = ModelSpec(
        dynamic_resolution=args.dynamic,
        video_temporal_patch_size=2 if args.t2 else 1,
        audio=not args.no_audio,
        mtp=args.mtp,
    )
    start = time.perf_counter()
    folder = checkpoint_folder(spec)
    written = time.perf_counter() - start
    timings = Timings()
    model, _ = build_and_load(module, folder, timings)
    params = sum(p.numel() for p in model.parameters())
    steps = {"import_s": round(imported, 3), "checkpoint_s": round(written, 3)}
    steps.update(timings.as_dict())
    print(json.dumps({"spec": spec.slug, "parameters": params, **steps}))
    return 0
