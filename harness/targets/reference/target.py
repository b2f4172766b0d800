"""The ``reference`` target: our model in ``reference_impl/``, built from the checkpoint folder by
``reference_impl.checkpoint.load_folder`` (:mod:`.model` wraps it for the suites)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import torch
from torch import nn

import reference_impl
from harness import ROOT
from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.runs_on import FUNCTIONS, LORA_MANAGER, REAL_MODEL, REQUEST_PATH
from harness.targets.base import (
    DeepcopyRefused,
    FreshModel,
    LiveParameter,
    LoRAMetadata,
    LoRAOptions,
    LoRAServing,
    MambaStateInfo,
    MinimalBuild,
    MultimodalModel,
    NotImplementedByTarget,
    ProcessorCounts,
    ProcessorMetadata,
    ReadBack,
    Target,
    TargetIdentity,
    lora_attributes,
    sha256_of,
)
from harness.targets.reference.model import Answers, ReferenceModel
from reference_impl import metadata as config_metadata
from reference_impl import processor, tiling
from reference_impl.audio import audio_token_count
from reference_impl.checkpoint import checkpoint_state_dict, load_folder, load_vl_checkpoint
from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.inputs import (
    AudioFeatureInputs,
    ImageEmbeddingInputs,
    ImagePixelInputs,
    VideoEmbeddingInputs,
    VideoPixelInputs,
    int_list,
)
from reference_impl.mamba_state import mamba_state_dtype_from_config, mamba_state_shape_from_config
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.nemotron_h import MLP as MLPMixer
from reference_impl.nemotron_h import Attention, Mamba2Mixer, MoE, NemotronHForCausalLM
from reference_impl.shrink import minimal_vl_config
from reference_impl.tokenizer import shared_tokenizer
from reference_impl.video_replacement import video_replacement_ids

_T = TypeVar("_T")

#: What each concern of the suites runs on, for this target (:mod:`harness.runs_on`).
RUNS_ON_BY_CONCERN = {
    "requests": REQUEST_PATH,
    "model": REAL_MODEL,
    "weights": REAL_MODEL,
    "minimal": REAL_MODEL,
    "lora": LORA_MANAGER,
}


class ConfigMetadata(ProcessorMetadata):
    """The reference's metadata functions of the config, counting processor constructions."""

    def __init__(self, config: VLConfig, tokenizer: object) -> None:
        self.config = config
        # The tokenizer the engine shares, as vLLM's processing info holds it; the reference's
        # answers never touch it (a mutant that builds a processor in a metadata call does).
        self.tokenizer = tokenizer
        self.constructions = 0

    def _answer(self, question: Callable[[], _T]) -> _T:
        with _processor_counting.counting() as counted:
            answer = question()
        self.constructions += counted[0]
        return answer

    def supports_video(self) -> bool:
        return self._answer(lambda: config_metadata.supports_video(self.config))

    def supports_audio(self) -> bool:
        return self._answer(lambda: config_metadata.supports_audio(self.config))

    def is_dynamic_tiler(self) -> bool:
        return self._answer(lambda: config_metadata.is_dynamic_tiler(self.config))

    def supported_limits(self) -> dict[str, int | None]:
        return self._answer(lambda: config_metadata.supported_limits(self.config))

    def embedding_width(self) -> int | None:
        return self.config.hidden_size  # the processor checks every embedding's width

    def routed_keys(self) -> dict[str, str]:
        keys = {
            key: modality
            for modality, names in config_metadata.MODEL_INPUT_KEYS.items()
            for key in names
            if modality != "audio" or config_metadata.supports_audio(self.config)
        }
        return keys

    def max_tokens_per_item(self, seq_len: int, counts: dict[str, int]) -> dict[str, int]:
        return self._answer(
            lambda: config_metadata.max_tokens_per_item(self.config, seq_len, counts)
        )

    def profiling_video_frames(self, seq_len: int, counts: dict[str, int]) -> int:
        return self._answer(
            lambda: config_metadata.profiling_video_frames(self.config, seq_len, counts)
        )


#: The layer kind (pattern letter) of each mixer class of the reference language model.
MIXER_LETTERS: dict[type[nn.Module], str] = {
    Mamba2Mixer: "M",
    Attention: "*",
    MLPMixer: "-",
    MoE: "E",
}


class _TrappedEngineConfig:
    """An engine-config stand-in: the nested VL config, a live parameter where an engine keeps
    live layers, and a ``__deepcopy__`` that refuses."""

    def __init__(self, text_config: NemotronHConfig, tp_size: int) -> None:
        self.model_config = SimpleNamespace(
            hf_config=SimpleNamespace(text_config=text_config), dtype=torch.bfloat16
        )
        self.parallel_config = SimpleNamespace(tensor_parallel_size=tp_size)
        self.cache_config = SimpleNamespace(
            mamba_cache_dtype="auto", mamba_ssm_cache_dtype="float32"
        )
        self.compilation_config = SimpleNamespace(
            static_forward_context={"layer": LiveParameter(torch.zeros(2))}
        )
        self.num_speculative_tokens = 0

    def __deepcopy__(self, memo: dict[int, object]) -> _TrappedEngineConfig:
        raise DeepcopyRefused("the whole engine config was deep-copied")


class _ProcessorCounting:
    """Counts constructions of the reference processor while any metadata call runs. Metadata
    calls run concurrently, so the patch is reference-counted and installed under a lock; a
    construction in any thread during the call counts (an over-count, never a miss)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._original: Any = None
        self._counters: list[list[int]] = []

    @contextlib.contextmanager
    def counting(self) -> Iterator[list[int]]:
        cls = processor.NanoNemotronVLProcessor
        counter = [0]
        with self._lock:
            if self._users == 0:
                self._original = original = cls.__init__
                counters = self._counters

                def counted_init(obj: Any, *args: Any, **kwargs: Any) -> None:
                    for c in list(counters):
                        c[0] += 1
                    original(obj, *args, **kwargs)

                cls.__init__ = counted_init  # type: ignore[method-assign, assignment]
            self._users += 1
            self._counters.append(counter)
        try:
            yield counter
        finally:
            with self._lock:
                del self._counters[next(i for i, c in enumerate(self._counters) if c is counter)]
                self._users -= 1
                if self._users == 0:
                    cls.__init__ = self._original  # type: ignore[method-assign]


_processor_counting = _ProcessorCounting()


class ReferenceTarget(Target):
    devices = frozenset({"cpu", "cuda"})
    deviations_name = "reference"

    @property
    def name(self) -> str:
        return "reference"

    def identity(self) -> TargetIdentity:
        root = Path(reference_impl.__file__).parent
        try:
            version = metadata.version("nemotron-vl-conformance")
        except metadata.PackageNotFoundError:
            version = "source tree"
        files = {f"reference_impl/{p.name}": sha256_of(p) for p in sorted(root.glob("*.py"))}
        return TargetIdentity(name="reference", version=version, files=files)

    def runs_on(self, concern: str) -> str:
        return RUNS_ON_BY_CONCERN.get(concern, FUNCTIONS)

    def __init__(self, answers: Answers | None = None) -> None:
        """``answers``: where its models keep their answers about requests, when the reference
        is another target's oracle (None: computed every time)."""
        super().__init__()
        self.answers = answers
        self._fresh: dict[ModelSpec, NanoNemotronVLForConditionalGeneration] = {}

    def build_model(
        self, spec: ModelSpec, folder: Path, device: torch.device, serving: ServingConfig
    ) -> tuple[MultimodalModel, dict[str, float]]:
        """The reference applies ``serving`` in its own terms: ``--dtype`` the dtype its model
        computes in ("auto": fp32, the oracle's precision, whatever the folder is saved in);
        ``--max-model-len`` and ``--mm-processor-kwargs`` its processor's context and options;
        the request-level options (embeddings accepted, per-prompt limits, the context, the
        video loader's frames) in its request path (:mod:`.requests`). It has no caches to
        size and no tensor parallelism: checks of those raise :class:`NotImplementedByTarget`."""
        dtype = serving.torch_dtype() or torch.float32

        def load() -> NanoNemotronVLForConditionalGeneration:
            return load_folder(
                folder,
                shared_tokenizer(),
                dtype=dtype,
                max_num_tiles=spec.max_num_tiles,
                video_pruning_rate=spec.video_pruning_rate,
                processor_options=serving.processor_kwargs(),
                max_model_len=serving.max_model_len,
            ).to(device)

        start = time.perf_counter()
        # As an oracle with kept answers, loaded on the first question not answered there.
        model = ReferenceModel(load, spec, serving, device, dtype, self.answers)
        built = round(time.perf_counter() - start, 3)
        return model, {"build_and_load_s": built}

    def fresh_model(self, spec: ModelSpec, text_only: bool) -> FreshModel:
        if spec not in self._fresh:
            self._fresh[spec] = NanoNemotronVLForConditionalGeneration(
                spec.vl_config(), shared_tokenizer()
            )
        return _FreshReference(self._fresh[spec], text_only)

    def linear_quantization(self, spec: ModelSpec) -> dict[str, str | None]:
        raise NotImplementedByTarget(
            "the reference has no quantization: it builds every layer in the model's dtype and "
            f"reads no quantization_config (spec {spec.slug})"
        )

    def build_minimal(self, spec: ModelSpec, overrides: dict[str, object]) -> MinimalBuild:
        config = minimal_vl_config(spec.vl_config(), overrides=overrides)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()
        layers: Any = model.language_model.model.layers
        kinds = "".join(MIXER_LETTERS[type(block.mixer)] for block in layers)
        tile = torch.randn(1, 3, config.force_image_size, config.force_image_size)
        with torch.no_grad():
            out = model.multimodal.embed_multimodal(
                pixel_values_flat=tile, image_num_patches=torch.tensor([1])
            )
        return MinimalBuild(layer_kinds=kinds, vision_rows=int(out[0].shape[0]))

    def validate_contract(self, kind: str, fields: dict[str, object], hidden_size: int) -> None:
        f = fields
        if kind in ("image_embeds", "video_embeds"):
            cls = ImageEmbeddingInputs if kind == "image_embeds" else VideoEmbeddingInputs
            key = kind
            data = f[key]
            cls(data=list(data) if isinstance(data, tuple) else data).validate(  # type: ignore[arg-type]
                hidden_size
            )
        elif kind == "pixel_values":
            ImagePixelInputs(
                f["pixel_values_flat"],  # type: ignore[arg-type]
                int_list("image_num_patches", f["image_num_patches"]),
            ).validate()
        elif kind == "pixel_values_videos":
            VideoPixelInputs(
                f["pixel_values_flat_video"],  # type: ignore[arg-type]
                int_list("video_num_patches", f["video_num_patches"]),
                int_list("frames_indices", f["frames_indices"]),
                int_list("frame_duration_ms", f["frame_duration_ms"]),
            ).validate(patch_size=1, shuffle_factor=1)
        elif kind == "audio_features":
            AudioFeatureInputs(
                f["input_audio_features"],  # type: ignore[arg-type]
                f["feature_attention_mask"],  # type: ignore[arg-type]
                int_list("audio_num_clips", f["audio_num_clips"]),
            ).validate()
        else:
            raise ValueError(f"kind: unknown input kind {kind!r}")

    def mamba_state(self, text_config: NemotronHConfig, tp_size: int) -> MambaStateInfo:
        engine = _TrappedEngineConfig(text_config, tp_size)
        conv, ssm = mamba_state_shape_from_config(engine)
        return MambaStateInfo(conv, ssm, mamba_state_dtype_from_config(engine))

    def metadata(
        self, spec: ModelSpec, tokenizer: object, *, fresh: bool = False
    ) -> ProcessorMetadata:
        return ConfigMetadata(spec.vl_config(), tokenizer)  # a new config on every call

    def video_replacement(
        self,
        tokenizer: object,
        tokens_per_frame: list[int],
        frames_indices: list[int],
        frame_duration_ms: int | None,
        temporal_patch_size: int,
    ) -> tuple[int, ...]:
        return tuple(
            video_replacement_ids(
                tokenizer,
                tokens_per_frame,
                frames_indices,
                frame_duration_ms,
                temporal_patch_size,
            )
        )

    def processor_counts(self) -> ProcessorCounts:
        config = ModelSpec().vl_config()
        audio = config.sound_config
        assert audio is not None, "the default checkpoint has audio"
        return ProcessorCounts(
            static_tiles=lambda width, height, max_tiles: tiling.num_static_tiles(
                width, height, config.force_image_size, max_tiles, config.use_thumbnail
            ),
            dynamic_grids=lambda sizes, budget, patch, lo, hi: tiling.dynamic_grids(
                sizes, budget, patch, lo, hi
            ),
            audio_tokens=lambda n: audio_token_count(n, audio),
        )

    def typing_cases(self) -> Path:
        return ROOT / "fixtures" / "typing" / "reference"

    def lora(self, spec: ModelSpec, options: LoRAOptions) -> LoRAServing:
        from harness.targets.reference.lora import ReferenceLoRAServing

        loaded = load_folder(
            checkpoint_folder(spec),
            shared_tokenizer(),
            max_num_tiles=spec.max_num_tiles,
            video_pruning_rate=spec.video_pruning_rate,
        )
        return ReferenceLoRAServing(loaded, options)

    def lora_metadata(self) -> LoRAMetadata:
        return LoRAMetadata(
            supports_lora=True,
            multimodal=lora_attributes(NanoNemotronVLForConditionalGeneration),
            language_model=lora_attributes(NemotronHForCausalLM),
        )

    def tensor_parallel_shards(
        self, spec: ModelSpec, tp_size: int
    ) -> dict[int, dict[str, torch.Tensor]]:
        raise NotImplementedByTarget(
            "the reference has no tensor parallelism: one process holds every parameter whole "
            f"(spec {spec.slug}, --tensor-parallel-size {tp_size})"
        )


class _FreshReference(FreshModel):
    """The reference model of a spec, weights not loaded; read back in checkpoint naming
    (:func:`~reference_impl.checkpoint.checkpoint_state_dict`: the reference names its tensors
    as the checkpoint does, fused ones split back)."""

    def __init__(self, model: NanoNemotronVLForConditionalGeneration, text_only: bool) -> None:
        self.model = model
        self.text_only = text_only

    def loadable(self) -> Iterable[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_vl_checkpoint(self.model, weights, text_only=self.text_only)

    def read_back(self, checkpoint: dict[str, torch.Tensor]) -> Iterable[ReadBack]:
        for name, value in checkpoint_state_dict(self.model).items():
            # The reference's parameters are named as the checkpoint names them.
            sources = (name,) if name in checkpoint else ()
            yield ReadBack(name, value, checkpoint.get(name), sources=sources)
