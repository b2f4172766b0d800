"""The Target interface: what the suites may ask of an implementation under test.

A *target* knows how to build a weight-less *model shell* of its implementation: the real
multimodal wrapper class with recording test doubles in place of the vision and audio towers and a
tiny embedding table in place of the language model. Suites drive shells only through this
interface, so the same check runs against our reference, the installed vLLM, or a vLLM file from a
pull request.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.tokenizer import VOCAB_SIZE

Modality = Literal["images", "videos", "audios"]


class TargetLoadError(RuntimeError):
    """The implementation under test could not be loaded (the harness cannot run: exit 2)."""


class TargetUnavailable(RuntimeError):
    """The target's implementation is not installed here (its checks skip with this reason)."""


@dataclass(frozen=True)
class TargetIdentity:
    """What was tested: recorded in every report."""

    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "files": dict(self.files)}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class ShellSpec:
    """Sizes of a model shell. Small enough for CPU, shaped like the real model.

    The default tile is 32 px with 8 px patches: a 4 x 4 grid, pixel-shuffled to 4 embedding rows
    per tile.
    """

    hidden_size: int = 32
    vit_hidden_size: int = 8
    projector_hidden_size: int = 16
    image_size: int = 32
    patch_size: int = 8
    video_temporal_patch_size: int = 1
    dynamic_resolution: bool = False
    audio: bool = True
    num_mel_bins: int = 8
    audio_subsampling: int = 2

    def vl_config(self) -> VLConfig:
        return VLConfig(
            hidden_size=self.hidden_size,
            vocab_size=VOCAB_SIZE,
            vit_hidden_size=self.vit_hidden_size,
            projector_hidden_size=self.projector_hidden_size,
            force_image_size=self.image_size,
            patch_size=self.patch_size,
            video_temporal_patch_size=self.video_temporal_patch_size,
            dynamic_resolution=self.dynamic_resolution,
            has_audio=self.audio,
        )

    @property
    def tokens_per_tile(self) -> int:
        return self.vl_config().num_image_token


@dataclass(frozen=True)
class ParsedModality:
    """One modality of a parse result, normalised across targets."""

    kind: str  # vLLM's schema ``type``: "pixel_values", "image_embeds", "video_embeds", ...
    num_items: int


@dataclass
class EncoderCalls:
    """What the recording test doubles saw since the last reset."""

    vision: list[str] = field(default_factory=list)  # one entry per call: "tiles", "video", ...
    audio: list[int] = field(default_factory=list)  # clips per call

    def reset(self) -> None:
        self.vision.clear()
        self.audio.clear()


LORA_ATTRIBUTES = (
    "packed_modules_mapping",
    "embedding_modules",
    "lora_skip_prefixes",
    "is_non_gated_moe",
)


@dataclass(frozen=True)
class MambaStateInfo:
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]


class LiveParameter(torch.nn.Parameter):
    """A parameter a serving engine holds live in its config: deep-copying it fails."""

    def __deepcopy__(self, memo: dict[int, object]) -> LiveParameter:
        raise RuntimeError("deepcopy of a live parameter held by the engine config")


class DeepcopyRefused(RuntimeError):
    """The whole engine config was deep-copied."""


@dataclass(frozen=True)
class ProcessorCounts:
    """A target's processor arithmetic as plain functions.

    - ``static_tiles(width, height, tile, max_tiles, use_thumbnail) -> tiles``
    - ``dynamic_grids(sizes, tokens_available, patch, min_patches, max_patches)
      -> [(cols, rows)]``
    - ``audio_tokens(num_samples) -> placeholders`` (16 kHz, 128 mel bins, subsampling 8)
    """

    static_tiles: Callable[[int, int, int, int, bool], int]
    dynamic_grids: Callable[[list[tuple[int, int]], int, int, int, int], list[tuple[int, int]]]
    audio_tokens: Callable[[int], int]


@dataclass(frozen=True)
class LoRAMetadata:
    """LoRA attributes of the multimodal class and of its language model class."""

    supports_lora: bool
    multimodal: dict[str, object]
    language_model: dict[str, object]


def lora_attributes(cls: type) -> dict[str, object]:
    return {name: getattr(cls, name, None) for name in LORA_ATTRIBUTES}


class ModelShell(abc.ABC):
    """A weight-less instance of a target's multimodal wrapper."""

    def __init__(self, spec: ShellSpec, calls: EncoderCalls, device: torch.device) -> None:
        self.spec = spec
        self.calls = calls
        self.device = device

    def parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        """The target's parse step, normalised; keys in the target's modality order."""
        return self._parse(**self.on_device(kwargs))

    def embed_multimodal(self, **kwargs: object) -> tuple[torch.Tensor, ...]:
        """The target's ``embed_multimodal``, called with these keyword arguments (tensors moved
        to the shell's device)."""
        return self._embed(None, **self.on_device(kwargs))

    def embed_multimodal_with_counts(
        self, placeholder_counts: Sequence[int], **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        """``embed_multimodal`` where the prompt's placeholder counts are known.

        Targets without a count check at the boundary (vLLM) just embed.
        """
        return self._embed(list(placeholder_counts), **self.on_device(kwargs))

    def on_device(self, kwargs: dict[str, object]) -> dict[str, object]:
        """Tensors (and lists or tuples of tensors) moved to the shell's device; order kept."""

        def move(value: object) -> object:
            if isinstance(value, torch.Tensor):
                return value.to(self.device)
            if isinstance(value, list):
                return [move(v) for v in value]
            if isinstance(value, tuple):
                return tuple(move(v) for v in value)
            return value

        return {key: move(value) for key, value in kwargs.items()}

    @abc.abstractmethod
    def use_raising_lora_embedding(self) -> None:
        """Replace the language model's ``embed_tokens`` with a LoRA wrapper (the target's own
        wrapper class) whose forward raises: only its ``base_layer`` may be used."""

    @abc.abstractmethod
    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]: ...

    @abc.abstractmethod
    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]: ...


class Target(abc.ABC):
    """An implementation under test."""

    #: devices whose tensors this target can run on
    devices: frozenset[str] = frozenset({"cpu"})
    #: the known-deviation file under ``fixtures/deviations/`` that applies to this target
    deviations_name: str = ""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The ``--target`` value that selects this target."""

    def load(self) -> object:
        """Import the implementation; may raise TargetUnavailable or TargetLoadError."""
        return None

    @abc.abstractmethod
    def identity(self) -> TargetIdentity:
        """Name, version and hashes of the files under test."""

    @abc.abstractmethod
    def build_shell(self, spec: ShellSpec, device: torch.device) -> ModelShell:
        """A fresh model shell with recording towers."""

    @abc.abstractmethod
    def validate_contract(self, kind: str, fields: dict[str, object], hidden_size: int) -> None:
        """Build the target's typed input of ``kind`` (vLLM's schema ``type``: "pixel_values",
        "image_embeds", "pixel_values_videos", "video_embeds", "audio_features") from
        ``fields`` (keyed by the processor's keyword names) with validation on; raise if it is
        rejected."""

    @abc.abstractmethod
    def mamba_state(self, text_config: NemotronHConfig, tp_size: int) -> MambaStateInfo:
        """The target's Mamba state-shape and dtype helpers for a multimodal config whose
        language model is ``text_config``, called on an engine config that holds a live
        parameter and refuses to be deep-copied (vLLM PR #38655). Conv shapes are reported as
        ``(channels, window)``."""

    @abc.abstractmethod
    def metadata_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        """The processor-info metadata questions (supports video / audio, dynamic tiler), each
        a call answering from the config; the processor factory refuses to run inside them."""

    @abc.abstractmethod
    def expansion_calls(self, spec: ShellSpec, tokenizer: object) -> list[Callable[[], object]]:
        """Prompt-expansion paths that use ``tokenizer`` (the video replacement in its forms)."""

    @abc.abstractmethod
    def processor_counts(self) -> ProcessorCounts:
        """The target's processor arithmetic (tile counts, dynamic grids, audio tokens)."""

    @abc.abstractmethod
    def typing_cases(self) -> Path:
        """The folder of this target's typing cases (``fixtures/typing/<name>``)."""

    @abc.abstractmethod
    def lora_metadata(self) -> LoRAMetadata:
        """The VL class's and its language model class's LoRA attributes."""
