"""The ``reference`` target: our wrapper in ``reference_impl/``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

import reference_impl
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
    lora_attributes,
    sha256_of,
)
from harness.targets.fakes import (
    FakeSoundEncoder,
    FakeVisionCore,
    FakeVisionTower,
    seeded_mlp1,
)
from reference_impl import processor
from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.dummy import mamba_state_dtype_from_config, mamba_state_shape_from_config
from reference_impl.inputs import (
    AudioFeatureInputs,
    ImageEmbeddingInputs,
    ImagePixelInputs,
    VideoEmbeddingInputs,
    VideoPixelInputs,
    int_list,
)
from reference_impl.lora import LoRAContext, LoRAEmbedding
from reference_impl.model import NanoNemotronVLForConditionalGeneration, NanoNemotronVLModel
from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer


class ReferenceShell(ModelShell):
    def __init__(self, spec: ShellSpec, device: torch.device) -> None:
        calls = EncoderCalls()
        super().__init__(spec, calls, device)
        core = FakeVisionCore(spec, calls)
        embed = nn.Embedding(VOCAB_SIZE, spec.hidden_size)
        with torch.no_grad():
            embed.weight.copy_(
                torch.randn(embed.weight.shape, generator=torch.Generator().manual_seed(7))
            )
        self.model = NanoNemotronVLModel(
            spec.vl_config(),
            vision_model=FakeVisionTower(core),
            embed_tokens=embed,
            tokenizer=shared_tokenizer(),
            sound_encoder=FakeSoundEncoder(spec, calls) if spec.audio else None,
        )
        self.model.connector.mlp1 = seeded_mlp1(spec.vl_config())
        self.model.to(device)

    def use_raising_lora_embedding(self) -> None:
        self.model.embed_tokens = RaisingLoRAEmbedding(self.model.embed_tokens)

    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        parsed = self.model.parse_multimodal_inputs(**kwargs)
        normalised: dict[str, ParsedModality] = {}
        for modality in parsed:
            inputs = parsed[modality]  # type: ignore[literal-required]  # keys of the TypedDict
            normalised[modality] = ParsedModality(inputs.kind, inputs.num_items)
        return normalised

    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        return self.model.embed_multimodal(placeholder_counts=placeholder_counts, **kwargs)


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


def _refuse_init(*args: object, **kwargs: object) -> None:
    raise AssertionError("a metadata path built the processor")


class _ProcessorRefusal:
    """While any metadata call runs, building the processor raises. Metadata calls run
    concurrently, so the patch is reference-counted and the original read under the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._original: Any = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        cls = processor.NanoNemotronVLProcessor
        with self._lock:
            if self._users == 0:
                self._original = cls.__init__
                cls.__init__ = _refuse_init  # type: ignore[method-assign]
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    cls.__init__ = self._original  # type: ignore[method-assign]


_processor_refusal = _ProcessorRefusal()


class RaisingLoRAEmbedding(LoRAEmbedding):
    """The reference's LoRA embedding wrapper, refusing to run: encoder-internal tokens must be
    embedded with ``base_layer``."""

    def __init__(self, base_layer: nn.Module) -> None:
        assert isinstance(base_layer, nn.Embedding)
        super().__init__(base_layer, LoRAContext(1), slots=1, max_rank=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the LoRA wrapper embedded tokens that have no mapping entry")


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

    def build_shell(self, spec: ShellSpec, device: torch.device) -> ModelShell:
        return ReferenceShell(spec, device)

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

    def metadata_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        config = spec.vl_config()

        def refusing(call: Callable[[VLConfig], bool]) -> Callable[[], object]:
            def answer() -> object:
                with _processor_refusal.active():
                    return call(config)

            return answer

        return [
            refusing(processor.supports_video),
            refusing(processor.supports_audio),
            refusing(processor.is_dynamic_tiler),
        ]

    def expansion_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        tok: Any = tokenizer
        return [
            lambda: tuple(processor.video_replacement_ids(tok, [4, 4, 4], [0, 1, 2], 500, 1)),
            lambda: tuple(processor.video_replacement_ids(tok, [4, 4], [0, 2, 4], 250, 2)),
            lambda: tuple(processor.video_replacement_ids(tok, [4, 4], [0, 1], None, 1)),
        ]

    def processor_counts(self) -> ProcessorCounts:
        from reference_impl.audio import AudioConfig, audio_token_count

        audio = AudioConfig(llm_hidden_size=8, num_mel_bins=128)
        return ProcessorCounts(
            static_tiles=processor.num_static_tiles,
            dynamic_grids=lambda sizes, budget, patch, lo, hi: processor.dynamic_grids(
                sizes, budget, patch, lo, hi
            ),
            audio_tokens=lambda n: audio_token_count(n, audio),
        )

    def typing_cases(self) -> Path:
        return Path(__file__).resolve().parents[2] / "fixtures" / "typing" / "reference"

    def lora_metadata(self) -> LoRAMetadata:
        return LoRAMetadata(
            supports_lora=True,
            multimodal=lora_attributes(NanoNemotronVLForConditionalGeneration),
            language_model=lora_attributes(NemotronHForCausalLM),
        )
