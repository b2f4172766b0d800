"""The ``vllm`` and ``vllm-file:PATH[,PATH...]`` targets.

``vllm`` is the installed vLLM's ``NemotronH_Nano_VL_V2``. ``vllm-file:`` loads model files from
any vLLM revision or pull request in place of the installed modules with the same path under
``vllm/`` (their own imports resolve against the installed vLLM).

This module owns everything that running vLLM's classes on a CPU-only host takes:

- ``VLLM_TARGET_DEVICE=cpu`` and ``HF_HUB_OFFLINE=1`` before the first ``import vllm``;
- a stand-in for the top-level VL config class (the real one is remote code on the model hub);
- a weight-less shell built like vLLM's own unit tests do (``object.__new__`` of the class, then
  only the attributes the multimodal path reads), with recording test doubles for the towers and
  our in-code tokenizer in place of the hub tokenizer.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import shutil
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from harness.targets.base import (
    DeepcopyRefused,
    EncoderCalls,
    LiveParameter,
    LoRAMetadata,
    MambaStateInfo,
    ModelShell,
    ParsedModality,
    ProcessorCounts,
    ShellSpec,
    Target,
    TargetIdentity,
    TargetLoadError,
    TargetUnavailable,
    lora_attributes,
    sha256_of,
)
from harness.targets.fakes import FakeRadioModel, FakeSoundEncoder, FakeVisionCore, seeded_mlp1
from reference_impl.config import NemotronHConfig
from reference_impl.tokenizer import (
    IMG_CONTEXT,
    IMG_END,
    IMG_START,
    VOCAB_SIZE,
    shared_tokenizer,
)

MODEL_MODULE = "vllm.model_executor.models.nano_nemotron_vl"
# The files a pull request to this model usually touches, by module name.
MODEL_FAMILY_MODULES = (
    "vllm.transformers_utils.processors.nano_nemotron_vl",
    "vllm.model_executor.models.radio",
    "vllm.model_executor.models.parakeet",
    "vllm.model_executor.models.nemotron_h",
    MODEL_MODULE,
)
# A bare file name (no ``vllm/`` in its path) names one of these modules.
BARE_FILE_NAMES = {
    "nano_nemotron_vl.py": MODEL_MODULE,
    "radio.py": "vllm.model_executor.models.radio",
    "parakeet.py": "vllm.model_executor.models.parakeet",
    "nemotron_h.py": "vllm.model_executor.models.nemotron_h",
}


def prepare_cpu_environment() -> None:
    """Environment vLLM needs on a CPU-only host; must run before the first ``import vllm``."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def vllm_version() -> str | None:
    """The installed vLLM's version without importing it, or None when it is absent."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _import_vllm_module(name: str) -> types.ModuleType:
    prepare_cpu_environment()
    if vllm_version() is None:
        raise TargetUnavailable("vLLM is not installed (pip install '.[vllm]' or use nox)")
    return importlib.import_module(name)


def module_name_for(path: Path) -> str:
    """The vLLM module a file replaces: its path from the last ``vllm/`` component, or for a bare
    file name one of the model's own modules."""
    parts = path.resolve().parts
    if "vllm" in parts[:-1]:
        start = len(parts) - 1 - parts[::-1].index("vllm")
        return ".".join((*parts[start:-1], path.stem))
    if path.name in BARE_FILE_NAMES:
        return BARE_FILE_NAMES[path.name]
    raise TargetLoadError(
        f"vllm-file: cannot tell which vLLM module {path} replaces: give it a path under a "
        f"'vllm/' folder (e.g. .../vllm/model_executor/models/{path.name}) or one of the "
        f"names {sorted(BARE_FILE_NAMES)}"
    )


def _load_order(name: str) -> int:
    # Leaves first: processors and configs, then the towers and the LM, the VL model last.
    if name == MODEL_MODULE:
        return 2
    if name.startswith("vllm.model_executor."):
        return 1
    return 0


def load_model_files(paths: Sequence[Path]) -> types.ModuleType:
    """Load ``paths`` in place of the installed modules; return the VL model module.

    When only some of the model's modules are replaced, the installed VL model module is
    re-executed too, so that its ``from .radio import RadioModel``-style bindings see the
    replacements.
    """
    _import_vllm_module("vllm")
    targets: dict[str, Path] = {}
    for path in paths:
        if not path.is_file():
            raise TargetLoadError(f"vllm-file: {path}: no such file")
        name = module_name_for(path)
        if name in targets:
            raise TargetLoadError(f"vllm-file: {path} and {targets[name]} both replace {name}")
        targets[name] = path
    if MODEL_MODULE not in targets:
        installed = importlib.util.find_spec(MODEL_MODULE)
        if installed is None or installed.origin is None:
            raise TargetUnavailable(f"{MODEL_MODULE} is not in the installed vLLM")
        targets[MODEL_MODULE] = Path(installed.origin)

    saved = {name: sys.modules.get(name) for name in targets}
    try:
        for name in sorted(targets, key=_load_order):
            _exec_in_place(name, targets[name])
    except BaseException:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        raise
    return sys.modules[MODEL_MODULE]


def _exec_in_place(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetLoadError(f"vllm-file: {path}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        missing = e.name or str(e)
        raise TargetLoadError(
            f"vllm-file: {path}: the installed vLLM {vllm_version()} lacks {missing!r} "
            f"({e}); this file needs a newer or different vLLM"
        ) from e
    except SyntaxError as e:
        raise TargetLoadError(f"vllm-file: {path}:{e.lineno}: syntax error: {e.msg}") from e
    except Exception as e:
        raise TargetLoadError(
            f"vllm-file: {path}: failed while importing as {name}: {type(e).__name__}: {e}"
        ) from e
    parent = sys.modules.get(parent_name)
    if parent is not None:
        setattr(parent, child, module)


# ---------------------------------------------------------------------------------------------
# The stand-in top-level config


def shell_text_fields(hidden_size: int) -> dict[str, Any]:
    """The NemotronH fields of every shell's language model: one Mamba and one attention layer,
    four heads of ``hidden_size // 4``; both config classes accept them."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": hidden_size,
        "hybrid_override_pattern": "M*",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // 4,
        "mamba_num_heads": 4,
        "mamba_head_dim": hidden_size // 4,
        "n_groups": 2,
        "ssm_state_size": 8,
        "intermediate_size": 2 * hidden_size,
    }


def build_vl_config(spec: ShellSpec) -> Any:
    """A stand-in for the hub's ``NemotronH_Nano_VL_V2`` config class, shaped by ``spec``."""
    from transformers import PretrainedConfig
    from transformers.models.nemotron_h import NemotronHConfig

    class NanoNemotronVLConfig(PretrainedConfig):  # type: ignore[misc]
        """The top-level fields vLLM's model reads, with nested text/vision/sound configs."""

        model_type = "NemotronH_Nano_VL_V2"

        def __init__(self, **kwargs: Any) -> None:
            self.text_config = kwargs.pop("text_config", None)
            self.vision_config = kwargs.pop("vision_config", None)
            self.sound_config = kwargs.pop("sound_config", None)
            super().__init__(**kwargs)

    text_config = NemotronHConfig(**shell_text_fields(spec.hidden_size))
    vision_args: dict[str, Any] = {"model": "vit_small_patch16_224"}
    if spec.dynamic_resolution:
        vision_args.update(min_num_patches=1, max_num_patches=64)
    vision_config = PretrainedConfig(
        args=vision_args,
        patch_size=spec.patch_size,
        preferred_resolution=[spec.image_size, spec.image_size],
        video_temporal_patch_size=spec.video_temporal_patch_size,
        separate_video_embedder=True,
    )
    sound_config = (
        PretrainedConfig(num_mel_bins=spec.num_mel_bins, subsampling_factor=spec.audio_subsampling)
        if spec.audio
        else None
    )
    return NanoNemotronVLConfig(
        text_config=text_config,
        vision_config=vision_config,
        sound_config=sound_config,
        force_image_size=spec.image_size,
        patch_size=spec.patch_size,
        downsample_ratio=0.5,
        ps_version="v2",
        template="nemotron-h-5p5",
        image_tag_type="internvl",
        vit_hidden_size=spec.vit_hidden_size,
        projector_hidden_size=spec.projector_hidden_size,
        norm_mean=[0.48145466, 0.4578275, 0.40821073],
        norm_std=[0.26862954, 0.26130258, 0.27577711],
        use_thumbnail=True,
    )


# ---------------------------------------------------------------------------------------------
# The shell


class _ShellModelConfig:
    """Stands in for ``ModelConfig`` where the shell reads it: the tokenizer lookup."""

    def __init__(self, hf_config: Any) -> None:
        self.hf_config = hf_config


class _Backbone(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB_SIZE, hidden_size)


class _EmbeddingOnlyLanguageModel(nn.Module):
    """Stands in for ``NemotronHForCausalLM``: the embedding table the video path reads."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.model = _Backbone(hidden_size)
        with torch.no_grad():
            weight = torch.randn(
                VOCAB_SIZE, hidden_size, generator=torch.Generator().manual_seed(7)
            )
            self.model.embed_tokens.weight.copy_(weight)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.embed_tokens(input_ids)
        return out

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_input_ids(input_ids)


def _patch_tokenizer_lookup(module: types.ModuleType) -> None:
    """Make the module's tokenizer lookup answer our in-code tokenizer for shell configs."""
    original = getattr(module, "cached_tokenizer_from_config")  # noqa: B009  # untyped module
    if getattr(original, "_harness_patched", False):
        return

    def lookup(model_config: Any, **kwargs: Any) -> Any:
        if isinstance(model_config, _ShellModelConfig):
            return shared_tokenizer()
        return original(model_config, **kwargs)

    lookup._harness_patched = True  # type: ignore[attr-defined]
    setattr(module, "cached_tokenizer_from_config", lookup)  # noqa: B010


class VllmShell(ModelShell):
    def __init__(self, module: types.ModuleType, spec: ShellSpec, device: torch.device) -> None:
        calls = EncoderCalls()
        super().__init__(spec, calls, device)
        self.module = module
        _patch_tokenizer_lookup(module)
        cls = module.NemotronH_Nano_VL_V2
        # As vLLM's own unit tests do: no __init__ (it needs a full engine config and weights),
        # then only what the multimodal path reads.
        model = object.__new__(cls)
        nn.Module.__init__(model)
        config = build_vl_config(spec)
        tokenizer = shared_tokenizer()
        core = FakeVisionCore(spec, calls)
        model.config = config
        model.model_config = _ShellModelConfig(config)
        model.patch_size = spec.patch_size
        model.template = config.template
        model.downsample_ratio = config.downsample_ratio
        model.ps_version = config.ps_version
        model.image_tag_type = config.image_tag_type
        model.num_image_token = spec.tokens_per_tile
        model.video_pruning_rate = None
        model.video_temporal_patch_size = spec.video_temporal_patch_size
        model.llm_dtype = torch.float32
        model.language_model = _EmbeddingOnlyLanguageModel(spec.hidden_size)
        model._language_model_names = ["language_model"]
        model.vision_model = FakeRadioModel(core)
        model.vision_final_layernorm = None
        # vLLM casts vision features to bfloat16 before mlp1 (hard-coded), so mlp1 is bf16.
        model.mlp1 = seeded_mlp1(spec.vl_config()).to(torch.bfloat16)
        model.sound_encoder = FakeSoundEncoder(spec, calls) if spec.audio else None
        model._img_start_token_ids = tokenizer.encode(IMG_START, add_special_tokens=False)
        model._img_end_token_ids = tokenizer.encode(IMG_END, add_special_tokens=False)
        model._img_context_token_ids = tokenizer.encode(IMG_CONTEXT, add_special_tokens=False)
        model.dynamic_resolution = spec.dynamic_resolution
        self.model = model.to(device)

    def use_raising_lora_embedding(self) -> None:
        from vllm.lora.layers.base import BaseLayerWithLoRA

        class RaisingEmbeddingWithLoRA(BaseLayerWithLoRA):  # type: ignore[misc]
            """vLLM's LoRA wrapper base class, refusing to run."""

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("the LoRA wrapper embedded tokens that have no mapping entry")

        backbone = self.model.language_model.model
        wrapper = RaisingEmbeddingWithLoRA()
        wrapper.base_layer = backbone.embed_tokens
        backbone.embed_tokens = wrapper

    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        parsed = self.model._parse_and_validate_multimodal_inputs(**kwargs)
        return {modality: _normalise(inputs) for modality, inputs in parsed.items()}

    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        # vLLM has no placeholder-count check at this boundary: the counts are not passed.
        return tuple(self.model.embed_multimodal(**kwargs))


def _normalise(inputs: Any) -> ParsedModality:
    if inputs is None:
        return ParsedModality(kind="none", num_items=0)
    kind = str(inputs["type"])
    if kind in ("image_embeds", "video_embeds"):
        count = len(inputs["data"])
    elif kind == "pixel_values_dynamic":
        count = len(inputs["num_tokens_per_image"])
    elif kind == "audio_features":
        count = len(inputs["audio_num_clips"])
    else:
        count = len(inputs["num_patches"])
    return ParsedModality(kind=kind, num_items=count)


# ---------------------------------------------------------------------------------------------
# Targets


class VllmTarget(Target):
    """The installed vLLM."""

    deviations_name = "vllm"

    def __init__(self) -> None:
        self._module: types.ModuleType | None = None
        self._engine: Any = None

    @property
    def name(self) -> str:
        return "vllm"

    def load(self) -> types.ModuleType:
        # One target per process: the harness never mixes ``vllm`` and ``vllm-file:`` in one.
        if self._module is None:
            self._module = _import_vllm_module(MODEL_MODULE)
        return self._module

    def identity(self) -> TargetIdentity:
        version = vllm_version()
        if version is None:
            return TargetIdentity(name=self.name, version="not installed")
        files = {}
        for name in MODEL_FAMILY_MODULES:
            found = importlib.util.find_spec(name)
            if found is not None and found.origin:
                rel = name.replace(".", "/") + ".py"
                files[rel] = sha256_of(Path(found.origin))
        return TargetIdentity(name=self.name, version=version, files=files)

    def build_shell(self, spec: ShellSpec, device: torch.device) -> ModelShell:
        return VllmShell(self.load(), spec, device)

    def validate_contract(self, kind: str, fields: dict[str, object], hidden_size: int) -> None:
        m, f = self.load(), fields
        if kind == "image_embeds":
            m.NanoNemotronVLImageEmbeddingInputs(type="image_embeds", data=f["image_embeds"])
        elif kind == "video_embeds":
            m.NanoNemotronVLVideoEmbeddingInputs(type="video_embeds", data=f["video_embeds"])
        elif kind == "pixel_values":
            m.NanoNemotronVLImagePixelInputs(
                pixel_values_flat=f["pixel_values_flat"], num_patches=f["image_num_patches"]
            )
        elif kind == "pixel_values_videos":
            m.NanoNemotronVLVideoPixelInputs(
                type="pixel_values_videos",
                pixel_values_flat=f["pixel_values_flat_video"],
                num_patches=f["video_num_patches"],
                frames_indices=f["frames_indices"],
                frame_duration_ms=f["frame_duration_ms"],
            )
        elif kind == "audio_features":
            m.NanoNemotronVLAudioFeatureInputs(
                input_audio_features=f["input_audio_features"],
                feature_attention_mask=f["feature_attention_mask"],
                audio_num_clips=f["audio_num_clips"],
            )
        else:
            raise ValueError(f"kind: unknown input kind {kind!r}")

    def mamba_state(self, text_config: NemotronHConfig, tp_size: int) -> MambaStateInfo:
        module = self.load()
        from transformers.models.nemotron_h import NemotronHConfig as HFNemotronHConfig
        from vllm.config import VllmConfig
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        engine = self._engine_config()
        stand_in = build_vl_config(ShellSpec(hidden_size=text_config.hidden_size))
        stand_in.text_config = HFNemotronHConfig(**text_config.to_transformers_dict())
        engine.model_config.hf_config = stand_in
        engine.parallel_config.tensor_parallel_size = tp_size
        engine.compilation_config.static_forward_context["harness_live_layer"] = LiveParameter(
            torch.zeros(2)
        )

        def refuse(self: Any, memo: dict[int, object]) -> Any:
            raise DeepcopyRefused("the whole VllmConfig was deep-copied")

        cls = module.NemotronH_Nano_VL_V2
        saved = VllmConfig.__dict__.get("__deepcopy__")
        VllmConfig.__deepcopy__ = refuse
        try:
            conv, ssm = cls.get_mamba_state_shape_from_config(engine)[:2]
            dtypes = tuple(cls.get_mamba_state_dtype_from_config(engine))
        finally:
            if saved is None:
                del VllmConfig.__deepcopy__
            else:
                VllmConfig.__deepcopy__ = saved
            engine.compilation_config.static_forward_context.pop("harness_live_layer", None)
        if not is_conv_state_dim_first():
            conv = tuple(reversed(conv))  # (window, channels) layout: report (channels, window)
        return MambaStateInfo(tuple(conv), tuple(ssm), dtypes)

    def _engine_config(self) -> Any:
        """A real ``VllmConfig`` built offline from a local NemotronH ``config.json`` (once per
        process: about 15 s, mostly imports)."""
        if self._engine is None:
            import json
            import tempfile

            from vllm.config import ModelConfig, VllmConfig

            folder = Path(tempfile.mkdtemp(prefix="nemotron-h-config-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            config = NemotronHConfig(**shell_text_fields(32))
            data = config.to_transformers_dict() | {
                "architectures": ["NemotronHForCausalLM"],
                "torch_dtype": "bfloat16",
            }
            (folder / "config.json").write_text(json.dumps(data))
            model_config = ModelConfig(model=str(folder), skip_tokenizer_init=True)
            self._engine = VllmConfig(model_config=model_config)
        return self._engine

    def metadata_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        module = self.load()
        config = build_vl_config(spec)

        class RefusingContext:
            """The processing context, with a processor factory that refuses to run."""

            model_config = SimpleNamespace(max_model_len=4096, hf_config=config)

            def get_hf_config(self, *args: object, **kwargs: object) -> Any:
                return config

            def get_tokenizer(self) -> Any:
                return tokenizer

            def init_processor(self, *args: object, **kwargs: object) -> Any:
                raise AssertionError("a metadata path built the processor")

            def get_mm_config(self) -> Any:
                return SimpleNamespace(video_pruning_rate=None)

        def info() -> Any:
            made = object.__new__(module.NanoNemotronVLProcessingInfo)
            made.ctx = RefusingContext()
            return made

        return [
            lambda: info().supports_video,
            lambda: info().supports_audio,
            lambda: info().is_dynamic_tiler,
        ]

    def expansion_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        processor_cls = self.load().NanoNemotronVLProcessor

        def encode(text: str) -> list[int]:
            ids: list[int] = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
            return ids

        special = {
            "img_start_token_ids": encode(IMG_START),
            "img_end_token_ids": encode(IMG_END),
            "img_context_token_ids": encode(IMG_CONTEXT),
        }

        def video(
            tokens: list[int], indices: list[int], duration: int | None, t: int
        ) -> Callable[[], object]:
            return lambda: tuple(
                processor_cls.get_video_repl(
                    tokens_per_frame=tokens,
                    frames_indices=indices,
                    frame_duration_ms=duration,
                    tokenizer=tokenizer,
                    video_temporal_patch_size=t,
                    **special,
                ).full
            )

        return [
            video([4, 4, 4], [0, 1, 2], 500, 1),
            video([4, 4], [0, 2, 4], 250, 2),
            video([4, 4], [0, 1], None, 1),
        ]

    def processor_counts(self) -> ProcessorCounts:
        self.load()
        from PIL import Image
        from transformers import PretrainedConfig
        from vllm.model_executor.models.parakeet import ParakeetExtractor
        from vllm.transformers_utils.processors import internvl
        from vllm.transformers_utils.processors import nano_nemotron_vl as processors

        def static_tiles(width: int, height: int, tile: int, max_tiles: int, thumb: bool) -> int:
            blocks, _, _ = internvl.calculate_internvl_targets(
                orig_width=width,
                orig_height=height,
                target_ratios=internvl.get_internvl_target_ratios(1, max_tiles),
                image_size=tile,
                use_thumbnail=thumb,
            )
            return int(blocks)

        def dynamic_grids(
            sizes: list[tuple[int, int]], budget: int, patch: int, lo: int, hi: int
        ) -> list[tuple[int, int]]:
            tiler = processors.DynamicResolutionImageTiler(
                max_model_len=1 << 20,
                patch_size=patch,
                min_num_patches=lo,
                max_num_patches=hi,
                downsample_ratio=0.5,
                norm_mean=[0.5] * 3,
                norm_std=[0.5] * 3,
            )
            params = tiler.compute_params([Image.new("L", size) for size in sizes], budget)
            return [tuple(p.patch_size) for p in params]

        extractor = ParakeetExtractor(
            PretrainedConfig(
                num_mel_bins=128,
                sampling_rate=16000,
                subsampling_factor=8,
                subsampling_conv_kernel_size=3,
                subsampling_conv_stride=2,
            )
        )
        return ProcessorCounts(
            static_tiles=static_tiles,
            dynamic_grids=dynamic_grids,
            audio_tokens=extractor.audio_token_count,
        )

    def typing_cases(self) -> Path:
        return Path(__file__).resolve().parents[2] / "fixtures" / "typing" / "vllm"

    def lora_metadata(self) -> LoRAMetadata:
        module = self.load()
        from vllm.model_executor.models.interfaces import supports_lora

        cls = module.NemotronH_Nano_VL_V2
        return LoRAMetadata(
            supports_lora=bool(supports_lora(cls)),
            multimodal=lora_attributes(cls),
            language_model=lora_attributes(module.NemotronHForCausalLM),
        )


class VllmFileTarget(VllmTarget):
    """Model files from another vLLM revision, loaded over the installed vLLM."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__()
        if not paths:
            raise TargetLoadError("vllm-file: expected vllm-file:PATH[,PATH...], got no paths")
        self.paths = [Path(p) for p in paths]
        for path in self.paths:
            if not path.is_file():
                raise TargetLoadError(f"vllm-file: {path}: no such file")
            module_name_for(path)  # fail early on an unplaceable file

    @property
    def name(self) -> str:
        return "vllm-file:" + ",".join(str(p) for p in self.paths)

    def load(self) -> types.ModuleType:
        if self._module is None:
            self._module = load_model_files(self.paths)
        return self._module

    def identity(self) -> TargetIdentity:
        files = {str(p): sha256_of(p) for p in self.paths}
        version = f"files over installed vLLM {vllm_version() or 'not installed'}"
        return TargetIdentity(name="vllm-file", version=version, files=files)
