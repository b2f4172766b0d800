"""The ``vllm`` and ``vllm-file:PATH[,PATH...]`` targets.

``vllm`` is the installed vLLM's ``NemotronH_Nano_VL_V2``; ``vllm-file:`` loads model files from
any vLLM revision or pull request in place of the installed modules (:mod:`.files`).

The model is built as for a user (:mod:`.build`): a checkpoint folder
(:mod:`harness.checkpoints.writer`), vLLM's ``ModelConfig`` and registry, its constructor, its
loader and post-load processing, on CPU (:mod:`.runtime`). The processing metadata is asked of the
processing info of the processor vLLM's registry makes for the folder, its processor factory
counting constructions.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from harness import ROOT
from harness.checkpoints.cache import checkpoint_folder, checkpoint_weights
from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.model_files import MODEL_FAMILY_MODULES, MODEL_MODULE
from harness.runs_on import FUNCTIONS, LORA_MANAGER, REAL_MODEL, REAL_PROCESSING_INFO, REQUEST_PATH
from harness.targets.base import (
    CACHE_PLATFORMS,
    CacheLayout,
    DeepcopyRefused,
    FreshModel,
    LiveParameter,
    LoRAMetadata,
    LoRAOptions,
    LoRAServing,
    MambaStateInfo,
    MinimalBuild,
    MultimodalModel,
    ProcessorCounts,
    ProcessorMetadata,
    ReadBack,
    Target,
    TargetIdentity,
    TargetLoadError,
    TargetUnavailable,
    lora_attributes,
    sha256_of,
)
from harness.targets.vllm import build
from harness.targets.vllm.files import load_model_files, module_name_for
from harness.targets.vllm.model import VllmModel
from harness.targets.vllm.runtime import (
    adapt_cpu_platform,
    applied_adaptations,
    import_vllm_module,
    prepare_cpu_environment,
    vllm_version,
    without_packed_cpu_kernels,
)
from reference_impl.config import NemotronHConfig

#: What each concern of the suites runs on, for this target (:mod:`harness.runs_on`).
RUNS_ON_BY_CONCERN = {
    "requests": REQUEST_PATH,
    "model": REAL_MODEL,
    "weights": REAL_MODEL,
    "minimal": REAL_MODEL,
    "lora": LORA_MANAGER,
    "metadata": REAL_PROCESSING_INFO,
}


class CountingMetadata(ProcessorMetadata):
    """vLLM's own ``NanoNemotronVLProcessingInfo``: the one of the multimodal processor vLLM's
    registry makes for the folder's ``ModelConfig`` with ``tokenizer``, its context's processor
    factory counting the processors it constructs (and constructing them)."""

    def __init__(self, model_config: Any, tokenizer: object) -> None:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        self.processor = MULTIMODAL_REGISTRY.create_processor(model_config, tokenizer=tokenizer)
        self.info = self.processor.info
        self.constructions = 0
        self._lock = threading.Lock()
        construct = self.info.ctx.init_processor

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.constructions += 1
            return construct(*args, **kwargs)

        # The context is a frozen dataclass, made for this processor alone.
        object.__setattr__(self.info.ctx, "init_processor", counted)

    def supports_video(self) -> bool:
        return bool(self.info.supports_video)

    def supports_audio(self) -> bool:
        return bool(self.info.supports_audio)

    def is_dynamic_tiler(self) -> bool:
        return bool(self.info.is_dynamic_tiler)

    def supported_limits(self) -> dict[str, int | None]:
        return dict(self.info.get_supported_mm_limits())

    def embedding_width(self) -> int | None:
        width = self.info.get_data_parser().expected_hidden_size
        return None if width is None else int(width)

    def routed_keys(self) -> dict[str, str]:
        from transformers import BatchFeature

        # One item of each modality: the sizes flat fields are split by.
        sizes = {k: torch.tensor([1]) for k in ("image_num_patches", "video_num_patches")}
        sizes["audio_num_clips"] = torch.tensor([1])
        fields = self.processor._get_mm_fields_config(BatchFeature(sizes), {})
        return {key: str(field.modality) for key, field in fields.items()}

    def max_tokens_per_item(self, seq_len: int, counts: dict[str, int]) -> dict[str, int]:
        answer = self.info.get_mm_max_tokens_per_item(seq_len=seq_len, mm_counts=counts)
        return {modality: int(tokens) for modality, tokens in answer.items()}

    def profiling_video_frames(self, seq_len: int, counts: dict[str, int]) -> int:
        return int(self.info.get_num_frames_with_most_features(seq_len, counts))


class VllmTarget(Target):
    """The installed vLLM."""

    deviations_name = "vllm"

    def __init__(self) -> None:
        super().__init__()
        self._module: types.ModuleType | None = None
        # Built models by spec and the options that change the built model (request-level
        # options share one).
        self._built: dict[tuple[ModelSpec, Path, ServingConfig], VllmModel] = {}
        self._fresh: dict[tuple[ModelSpec, bool], _FreshVllm] = {}
        self._engine_configs: dict[str, Any] = {}  # VllmConfigs by their text_config override
        self._model_configs: dict[ModelSpec, Any] = {}
        self._counts: ProcessorCounts | None = None

    @property
    def name(self) -> str:
        return "vllm"

    def load(self) -> types.ModuleType:
        # One target per process: the harness never mixes ``vllm`` and ``vllm-file:`` in one.
        if self._module is None:
            start = time.perf_counter()
            self._module = import_vllm_module(MODEL_MODULE)
            self.timings["import"] = {"import_s": round(time.perf_counter() - start, 3)}
        return self._module

    def identity(self) -> TargetIdentity:
        version = vllm_version()
        if version is None:
            return TargetIdentity(name=self.name, version="not installed")
        # find_spec imports the parent packages (vllm itself): the CPU environment first, or
        # vLLM settles on no platform and every later build fails to infer its device.
        prepare_cpu_environment()
        files = {}
        for name in MODEL_FAMILY_MODULES:
            found = importlib.util.find_spec(name)
            if found is not None and found.origin:
                rel = name.replace(".", "/") + ".py"
                files[rel] = sha256_of(Path(found.origin))
        adapt_cpu_platform()
        return TargetIdentity(
            name=self.name,
            version=version,
            files=files,
            adaptations=tuple(applied_adaptations()),
        )

    def runs_on(self, concern: str) -> str:
        return RUNS_ON_BY_CONCERN.get(concern, FUNCTIONS)

    # The model ---------------------------------------------------------------------------

    def forget_models(self) -> None:
        super().forget_models()
        self._built.clear()

    def build_model(
        self, spec: ModelSpec, folder: Path, device: torch.device, serving: ServingConfig
    ) -> tuple[MultimodalModel, dict[str, float]]:
        """vLLM's constructor and loader on the folder, under the engine config of ``vllm
        serve`` with ``serving``'s options (:mod:`.build`). Configurations that differ only in
        options that act on requests share one built model, each with its own engine config."""
        built = (spec, folder, serving.model_options())
        steps: dict[str, float] = {}
        if built not in self._built:
            timings = build.Timings()
            model, vllm_config = build.build_and_load(
                self.load(),
                folder,
                timings,
                spec.processor_options,
                spec.video_pruning_rate,
                serving=built[2],
            )
            self._built[built] = VllmModel(model, vllm_config, spec, built[2])
            steps = timings.as_dict()
        shared = self._built[built]
        if serving == built[2]:
            return shared, steps
        vllm_config = build.engine_config(
            folder,
            serving=serving,
            mm_processor_kwargs=spec.processor_options,
            video_pruning_rate=spec.video_pruning_rate,
        )
        return VllmModel(shared.model, vllm_config, spec, serving, shares=shared), steps

    # Weight loading ----------------------------------------------------------------------

    def fresh_model(self, spec: ModelSpec, text_only: bool) -> _FreshVllm:
        key = (spec, text_only)
        if key not in self._fresh:
            vllm_config = self._engine_config(spec, text_only=text_only)
            model = build.construct(self.load(), vllm_config)
            self._fresh[key] = _FreshVllm(model, vllm_config, checkpoint_weights(spec))
        return self._fresh[key]

    def linear_quantization(self, spec: ModelSpec) -> dict[str, str | None]:
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

        model = self.fresh_model(spec, text_only=False).model
        methods: dict[str, str | None] = {}
        for name, module in model.named_modules():
            if not isinstance(module, LinearBase):
                continue
            source = build.checkpoint_name(f"{name}.weight")
            if source is None:
                raise ValueError(f"{name}: a linear layer with no checkpoint tensor known")
            method = module.quant_method
            kind = None if isinstance(method, UnquantizedLinearMethod) else type(method).__name__
            checkpoint_module = source.removesuffix(".weight")
            if checkpoint_module.endswith(".qkv_proj"):
                for part in ("q_proj", "k_proj", "v_proj"):
                    methods[checkpoint_module.removesuffix("qkv_proj") + part] = kind
            else:
                methods[checkpoint_module] = kind
        return methods

    # Input contracts ---------------------------------------------------------------------

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

    # Configs -----------------------------------------------------------------------------

    def mamba_state(self, text_config: NemotronHConfig, tp_size: int) -> MambaStateInfo:
        module = self.load()
        from vllm.config import VllmConfig
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        fields = {k: v for k, v in text_config.to_transformers_dict().items() if k != "model_type"}
        key = json.dumps(fields, sort_keys=True)
        if key not in self._engine_configs:
            self._engine_configs[key] = build.engine_config(
                checkpoint_folder(ModelSpec()), hf_overrides={"text_config": fields}
            )
        engine = self._engine_configs[key]
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

    def build_minimal(self, spec: ModelSpec, overrides: dict[str, object]) -> MinimalBuild:
        module = self.load()
        from vllm.config import LoadConfig
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
        from vllm.model_executor.models.nemotron_h import ALL_DECODER_LAYER_TYPES

        vllm_config = self._engine_config(spec, hf_overrides=overrides)
        model = build.construct(module, vllm_config)
        # vLLM's dummy weights, as its own initialisation test loads them (load_format="dummy").
        get_model_loader(LoadConfig(load_format="dummy")).load_weights(
            model, vllm_config.model_config
        )
        with without_packed_cpu_kernels():
            process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
        letters = {cls: letter for letter, cls in ALL_DECODER_LAYER_TYPES.items()}
        kinds = "".join(letters[type(layer)] for layer in model.language_model.model.layers)
        dtype = next(model.mlp1.parameters()).dtype
        tile = torch.randn(1, 3, spec.image_size, spec.image_size, dtype=dtype)
        with torch.no_grad():
            out = model.embed_multimodal(
                pixel_values_flat=tile, image_num_patches=torch.tensor([1])
            )
        return MinimalBuild(layer_kinds=kinds, vision_rows=int(out[0].shape[0]))

    # Processor ---------------------------------------------------------------------------

    def metadata(
        self, spec: ModelSpec, tokenizer: object, *, fresh: bool = False
    ) -> ProcessorMetadata:
        self.load()
        if fresh:
            return CountingMetadata(self._engine_config(spec).model_config, tokenizer)
        return CountingMetadata(self._model_config(spec), tokenizer)

    def _engine_config(
        self,
        spec: ModelSpec,
        *,
        text_only: bool = False,
        hf_overrides: dict[str, Any] | None = None,
        serving: ServingConfig = DEFAULT_SERVING,
    ) -> Any:
        """A new ``VllmConfig`` of ``spec``'s folder, served with its processor options and
        ``serving``'s."""
        return build.engine_config(
            checkpoint_folder(spec),
            serving=serving,
            text_only=text_only,
            hf_overrides=hf_overrides,
            mm_processor_kwargs=spec.processor_options,
            video_pruning_rate=spec.video_pruning_rate,
        )

    def _model_config(self, spec: ModelSpec) -> Any:
        """The ``ModelConfig`` of ``spec``'s folder, made once."""
        if spec not in self._model_configs:
            config = self._engine_config(spec).model_config
            self._model_configs[spec] = config
        return self._model_configs[spec]

    def video_replacement(
        self,
        tokenizer: object,
        tokens_per_frame: list[int],
        frames_indices: list[int],
        frame_duration_ms: int | None,
        temporal_patch_size: int,
    ) -> tuple[int, ...]:
        from harness.targets.vllm.requests import video_replacement_ids

        ids = video_replacement_ids(
            tokenizer,
            tokens_per_frame,
            frames_indices,
            frame_duration_ms,
            temporal_patch_size,
            processor_cls=self.load().NanoNemotronVLProcessor,
        )
        return tuple(ids)

    def processor_counts(self) -> ProcessorCounts:
        """The methods of the processor vLLM's registry makes for the default folder: its HF
        processor's ``get_num_image_tokens`` and feature extractor, and the dynamic tiler class
        of the processor module under test."""
        self.load()
        from PIL import Image
        from vllm.transformers_utils.processors import nano_nemotron_vl as processors

        if self._counts is not None:
            return self._counts
        info = CountingMetadata(self._model_config(ModelSpec()), None).info
        hf_processor = info.get_hf_processor()

        def static_tiles(width: int, height: int, max_tiles: int) -> int:
            tokens = hf_processor.get_num_image_tokens(
                image_width=width, image_height=height, max_num_tiles=max_tiles
            )
            return int(tokens) // int(hf_processor.num_image_token)

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

        def audio_tokens(samples: int) -> int:
            return int(hf_processor.audio_extractor.audio_token_count(samples))

        self._counts = ProcessorCounts(
            static_tiles=static_tiles, dynamic_grids=dynamic_grids, audio_tokens=audio_tokens
        )
        return self._counts

    def typing_cases(self) -> Path:
        return ROOT / "fixtures" / "typing" / "vllm"

    def lora(self, spec: ModelSpec, options: LoRAOptions) -> LoRAServing:
        from harness.targets.vllm.lora import VllmLoRAServing

        module = self.load()
        model, vllm_config = build.build_and_load(
            module,
            checkpoint_folder(spec),
            mm_processor_kwargs=spec.processor_options,
            video_pruning_rate=spec.video_pruning_rate,
            lora=options,
        )
        return VllmLoRAServing(model, vllm_config)

    def cache_layout(self, spec: ModelSpec, serving: ServingConfig, platform: str) -> CacheLayout:
        from harness.targets.vllm import cache

        if platform not in CACHE_PLATFORMS:
            raise ValueError(f"platform: expected one of {list(CACHE_PLATFORMS)}, got {platform!r}")
        vllm_config = self._engine_config(spec, serving=serving)
        if platform == "cuda":
            return cache.cuda_layout(vllm_config)
        return cache.engine_layout(self.load(), vllm_config)

    def lora_metadata(self) -> LoRAMetadata:
        module = self.load()
        from vllm.model_executor.models.interfaces import supports_lora

        cls = module.NemotronH_Nano_VL_V2
        return LoRAMetadata(
            supports_lora=bool(supports_lora(cls)),
            multimodal=lora_attributes(cls),
            language_model=lora_attributes(module.NemotronHForCausalLM),
        )

    def tensor_parallel_shards(
        self, spec: ModelSpec, tp_size: int
    ) -> dict[int, dict[str, torch.Tensor]]:
        from harness.targets.vllm import tensor_parallel

        shards, timings = tensor_parallel.tensor_parallel_shards(self.load(), spec, tp_size)
        self.timings.update(timings)
        return shards


class _FreshVllm(FreshModel):
    """vLLM's model of a spec from its constructor, weights not loaded: every parameter, and
    the buffers a checkpoint carries (BatchNorm statistics), by vLLM's names; read back
    against the checkpoint tensor each must equal (:func:`.build.expected_parameter`: fused
    and sharded layouts, the loader's conversions)."""

    def __init__(self, model: Any, vllm_config: Any, checkpoint: dict[str, torch.Tensor]) -> None:
        self.model = model
        self.vllm_config = vllm_config
        self.checkpoint_buffers = {
            name for name, _ in model.named_buffers() if build.checkpoint_name(name) in checkpoint
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        """The model's tensors now (read each time: a loader may replace a parameter)."""
        tensors: dict[str, torch.Tensor] = dict(self.model.named_parameters())
        tensors.update(
            (name, buffer)
            for name, buffer in self.model.named_buffers()
            if name in self.checkpoint_buffers
        )
        return tensors

    def loadable(self) -> Iterable[torch.Tensor]:
        return [t for name, t in self.tensors().items() if build.checkpoint_name(name) is not None]

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        build.load_stream(self.model, self.vllm_config, weights)

    def read_back(self, checkpoint: dict[str, torch.Tensor]) -> Iterable[ReadBack]:
        for name, tensor in self.tensors().items():
            sources = build.checkpoint_sources(name)
            expected = build.expected_parameter(sources, tensor.shape, checkpoint)
            initialised = expected is None and name.endswith(build.CONSTRUCTOR_INITIALISED)
            yield ReadBack(name, tensor, expected, 1.0 if initialised else None, sources)


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

    def typing_shadows(self) -> list[tuple[Path, Path]]:
        found = importlib.util.find_spec("vllm")
        if found is None or found.origin is None:
            raise TargetUnavailable("vLLM is not installed")
        site = Path(found.origin).parent.parent  # the folder holding the vllm package
        return [
            (site / (module_name_for(path).replace(".", "/") + ".py"), path.resolve())
            for path in self.paths
        ]

    def identity(self) -> TargetIdentity:
        files = {str(p): sha256_of(p) for p in self.paths}
        version = f"files over installed vLLM {vllm_version() or 'not installed'}"
        if vllm_version() is not None:
            prepare_cpu_environment()
            adapt_cpu_platform()
        return TargetIdentity(
            name="vllm-file", version=version, files=files, adaptations=tuple(applied_adaptations())
        )
