"""The Target interface: what the suites may ask of an implementation under test.

A *target* builds its implementation the way a user gets it: from a tiny checkpoint folder
(:mod:`harness.checkpoints.writer`), through its own constructor and weight loader, real towers
included (:meth:`Target.model`). Suites reach a target only through small named methods, one concern
each (the model's multimodal path, weight loading, input contracts, state helpers, minimal
configs, processor metadata and arithmetic, typing cases, LoRA metadata), so the same check runs
against our reference, the installed vLLM, or a vLLM file from a pull request.

Every check records what it runs on (:mod:`harness.runs_on`): a request through the target's
engine, the real model built from the checkpoint folder, the target's LoRA manager, the real
processing info of the target's processor for that folder, or the implementation's classes and
functions directly. No check runs on a shell (an instance made without its constructor).
"""

from __future__ import annotations

import abc
import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.checkpoints.cache import checkpoint_folder, checkpoint_weights
from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.checkpoints.weight_streams import recording_reads
from harness.inputs.requests import ItemFeatures, ProcessedRequest, Request, RequestResult
from harness.runs_on import FUNCTIONS
from reference_impl.checkpoint import CONV_BIAS_SUFFIXES, TOWER_PREFIXES
from reference_impl.config import NemotronHConfig

#: Keyword arguments a processor emits as floating tensors: a serving engine casts them to the
#: model's dtype before the model sees them (vLLM's processing context does).
PROCESSOR_FLOAT_KEYS = ("pixel_values_flat", "pixel_values_flat_video", "input_audio_features")


class TargetLoadError(RuntimeError):
    """The implementation under test could not be loaded (the harness cannot run: exit 2)."""


class TargetUnavailable(RuntimeError):
    """The target's implementation is not installed here (its checks skip with this reason)."""


class NotImplementedByTarget(RuntimeError):
    """The target does not implement this input or capability (the message says which and why:
    the reference's quantization): the check skips with that reason, never passes."""


class NeedsCuda(RuntimeError):
    """The target cannot build this on a CPU (a layer with no CPU implementation): the check
    skips with this reason on a CPU and runs where CUDA is present."""


@dataclass(frozen=True)
class TargetIdentity:
    """What was tested: recorded in every report."""

    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    #: What the harness changed so that the release runs here (name, what, why_unchanged):
    #: :func:`harness.targets.vllm.runtime.adapt_cpu_platform`; none for most targets.
    adaptations: tuple[dict[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "files": dict(self.files),
            "adaptations": [dict(a) for a in self.adaptations],
        }


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class ParsedModality:
    """One modality of a parse result, normalised across targets."""

    kind: str  # vLLM's schema ``type``: "pixel_values", "image_embeds", "video_embeds", ...
    num_items: int


@dataclass
class EncoderCalls:
    """The calls the towers received since the last reset (recorded by hooks on the real
    towers; what runs is unchanged)."""

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


@dataclass(frozen=True)
class CacheLayout:
    """The caches an engine sizes for a served model: each attention layer's KV cache, each
    Mamba layer's state, and the hybrid block sizing that makes their pages equal.

    ``attention``: ``(num_kv_heads, head_size, dtype, bytes per token)`` per attention layer;
    ``mamba``: ``(shapes, dtypes, real page bytes)`` per Mamba layer (empty where the platform
    was only asked for its numbers, not given a model); ``block_size`` the attention block in
    tokens; ``mamba_page_size_padded`` the Mamba page after padding (None: not padded);
    ``mamba_block_size`` the tokens one Mamba state stands for; ``mamba_cache_mode`` vLLM's
    ("align" with prefix caching, "none" without)."""

    block_size: int
    mamba_block_size: int
    mamba_page_size_padded: int | None
    mamba_cache_mode: str
    attention: tuple[tuple[int, int, torch.dtype, int], ...]
    mamba: tuple[tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...], int], ...]


#: Where an engine sizes its caches: this machine's platform, or a CUDA GPU's (its default
#: attention backend's kernel block sizes), computed without one.
CACHE_PLATFORMS = ("engine", "cuda")


class LiveParameter(torch.nn.Parameter):
    """A parameter a serving engine holds live in its config: deep-copying it fails."""

    def __deepcopy__(self, memo: dict[int, object]) -> LiveParameter:
        raise RuntimeError("deepcopy of a live parameter held by the engine config")


class DeepcopyRefused(RuntimeError):
    """The whole engine config was deep-copied."""


@dataclass(frozen=True)
class ProcessorCounts:
    """A target's processor arithmetic for the default checkpoint folder, as plain functions
    (the methods of the target's own processor for the folder, where it has them).

    - ``static_tiles(width, height, max_tiles) -> tiles`` (the folder's tile size, thumbnail on)
    - ``dynamic_grids(sizes, tokens_available, patch, min_patches, max_patches)
      -> [(cols, rows)]``
    - ``audio_tokens(num_samples) -> placeholders`` (the folder's feature extractor: 16 kHz, hop
      160, subsampling 8)
    """

    static_tiles: Callable[[int, int, int], int]
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


@dataclass(frozen=True)
class LoRAOptions:
    """The engine's LoRA settings (vLLM's ``--max-loras``, ``--max-lora-rank``)."""

    max_loras: int = 2
    max_lora_rank: int = 8


@dataclass(frozen=True)
class AdapterLoad:
    """What a target's LoRA loader made of an adapter folder.

    Attributes:
        applied: the modules the adapter's weights were put into, by checkpoint module name
            (a packed layer's parts by their own names: ``...mixer.q_proj``), read from the
            target's LoRA layers once the adapter is active.
        told: what the target said while loading and activating it (warnings and log records
            at WARNING or above), in order.
    """

    applied: list[str]
    told: list[str]


class LoRAServing(abc.ABC):
    """A target's model of a checkpoint folder served with LoRA: built with the engine's LoRA
    settings, adapters loaded from PEFT folders by the target's own loader into its slots, and
    each batch's per-token adapter mapping set as the engine's model runner sets it (adapter id
    0: no adapter).
    """

    @abc.abstractmethod
    def add(self, adapter_id: int, folder: Path) -> AdapterLoad:
        """Load the adapter in ``folder`` under ``adapter_id`` (>= 1) and activate it, as the
        engine does for a request that names it. Whatever the loader raises propagates."""

    @abc.abstractmethod
    def remove(self, adapter_id: int) -> None:
        """Remove the adapter (its slot freed)."""

    @abc.abstractmethod
    def adapters(self) -> list[int]:
        """The ids of the adapters loaded, sorted."""

    @abc.abstractmethod
    def linear(self, module: str, x: torch.Tensor, adapters: Sequence[int]) -> torch.Tensor:
        """The adapted linear layer ``module`` (a checkpoint module name; a part of a packed
        layer gives that part's slice of the packed output) on ``x [T, in]``, token ``t``
        served with adapter ``adapters[t]``: ``[T, out]``."""

    @abc.abstractmethod
    def embed(self, ids: Sequence[int], adapters: Sequence[int]) -> torch.Tensor:
        """The language model's input embeddings ``[T, h]`` of prompt tokens ``ids``, token
        ``t`` served with adapter ``adapters[t]`` (the model's ``embed_input_ids``)."""

    @abc.abstractmethod
    def embed_multimodal(
        self, adapters: Sequence[int], **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        """``embed_multimodal`` of the LoRA-served model while a batch of prompt tokens mapped
        to ``adapters`` is active (the encoder runs beside the prompt's tokens)."""

    @abc.abstractmethod
    def run_request(self, request: Request, adapters: Sequence[int]) -> RequestResult:
        """A user's request through the LoRA-served model's request path (as
        :meth:`MultimodalModel.run_request`) while a batch of prompt tokens mapped to
        ``adapters`` is active."""


@dataclass(frozen=True)
class LoadedWeights:
    """What a target's weight loader made of a checkpoint.

    Attributes:
        not_loaded: parameters the loader left unset, by the target's name.
        differing: parameters whose value is not the checkpoint's tensor (name: what differs).
        tower_tensors_read: checkpoint tensors of the towers the loader read (text-only mode
            must read none).
        unheld: checkpoint tensors the model of the spec holds (by the architecture) that no
            parameter of the target's model holds, by checkpoint name: a loader that skips a
            tensor it has no parameter for (a bias switch read wrongly) drops it silently.
    """

    not_loaded: list[str]
    differing: list[str]
    tower_tensors_read: list[str]
    unheld: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReadBack:
    """One tensor of a loaded model read back for comparison with the checkpoint.

    Attributes:
        name: the target's name for it.
        tensor: its value after loading.
        expected: the checkpoint tensor it must equal (the part of a fused tensor, converted as
            the target's loader converts it); None when no checkpoint tensor is known to load it.
        constructor_value: for a tensor no checkpoint holds and the constructor sets (vLLM's
            identity layer scales), the value every element must keep; None otherwise.
        sources: the checkpoint tensors ``expected`` is made of, by checkpoint name (q, k and v
            for a fused projection).
    """

    name: str
    tensor: torch.Tensor
    expected: torch.Tensor | None
    constructor_value: float | None = None
    sources: tuple[str, ...] = ()


def dropped_by_the_architecture(spec: ModelSpec, checkpoint: Iterable[str]) -> set[str]:
    """The checkpoint tensors no parameter of ``spec``'s model needs to hold, by the
    architecture: batch norms' ``num_batches_tracked`` (a training counter inference never
    reads), and the Parakeet convolution biases of the Omni form (``convolution_bias = False``),
    which released checkpoints carry all the same (vLLM #40007)."""
    bias_free = spec.audio and not spec.audio_convolution_bias
    return {
        name
        for name in checkpoint
        if name.endswith(".num_batches_tracked")
        or (bias_free and name.endswith(CONV_BIAS_SUFFIXES))
    }


def compare_read_back(read_back: Iterable[ReadBack]) -> tuple[list[str], list[str]]:
    """Every tensor read back against the checkpoint, the same way for every target: (not
    loaded, differing with what). A floating tensor still holding a NaN was left alone by the
    loader (every one is poisoned before the load); one with no checkpoint tensor known differs
    unless the constructor sets it and it kept that value."""
    not_loaded: list[str] = []
    differing: list[str] = []
    with torch.no_grad():
        for item in read_back:
            name, tensor, expected = item.name, item.tensor, item.expected
            if expected is None:
                if item.constructor_value is None:
                    differing.append(f"{name}: no checkpoint tensor is known to load it")
                elif not torch.all(tensor == item.constructor_value):
                    differing.append(
                        f"{name}: not the constructor's value {item.constructor_value:g}"
                    )
            elif tensor.is_floating_point() and torch.isnan(tensor).any():
                not_loaded.append(name)
            elif expected.shape != tensor.shape:
                differing.append(
                    f"{name}: shape {tuple(tensor.shape)}, checkpoint {tuple(expected.shape)}"
                )
            elif not torch.equal(tensor.to(expected.dtype), expected):
                if tensor.is_floating_point():
                    diff = (tensor.float() - expected.float()).abs().max().item()
                    differing.append(f"{name}: max |difference| {diff:.3g}")
                else:
                    differing.append(f"{name}: not the checkpoint's values")
    return not_loaded, differing


class FreshModel(abc.ABC):
    """A model of a checkpoint variant from the target's own constructor, weights not loaded,
    as the weight-loading check drives it (:meth:`Target.load_weights`)."""

    @abc.abstractmethod
    def loadable(self) -> Iterable[torch.Tensor]:
        """The model's own tensors its loader must set (poisoned with NaN before each load)."""

    @abc.abstractmethod
    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The target's weight loader on checkpoint-named ``weights``, streamed in order."""

    @abc.abstractmethod
    def read_back(self, checkpoint: dict[str, torch.Tensor]) -> Iterable[ReadBack]:
        """Every tensor of the model with the checkpoint tensor it must equal, by the target's
        naming of its parameters."""


@dataclass(frozen=True)
class MinimalBuild:
    """A model built from the checkpoint with minimal-layer overrides (weights not loaded)."""

    layer_kinds: str  # the language model's pattern as built: one letter per layer
    vision_rows: int  # embedding rows the built towers give for one static tile


class MultimodalModel(abc.ABC):
    """A target's multimodal model as the suites drive it: parse, embed, the LoRA embedding.

    Built once per spec and shared between checks: every check starts with fresh
    :attr:`calls`, and what a check changes (the LoRA wrapper) it restores.
    """

    def __init__(
        self,
        spec: ModelSpec,
        calls: EncoderCalls,
        device: torch.device,
        input_dtype: torch.dtype,
        serving: ServingConfig = DEFAULT_SERVING,
    ) -> None:
        self.spec = spec
        self.calls = calls
        self.device = device
        self.input_dtype = input_dtype
        self.serving = serving

    def parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        """The target's parse step, normalised; keys in the target's modality order."""
        return self._parse(**self.as_model_inputs(kwargs))

    def embed_multimodal(self, **kwargs: object) -> tuple[torch.Tensor, ...]:
        """The target's ``embed_multimodal`` for these keyword arguments."""
        with torch.no_grad():
            return self._embed(None, **self.as_model_inputs(kwargs))

    def embed_multimodal_with_counts(
        self, placeholder_counts: Sequence[int], **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        """``embed_multimodal`` where the prompt's placeholder counts are known.

        Targets without a count check at the boundary (vLLM) just embed.
        """
        with torch.no_grad():
            return self._embed(list(placeholder_counts), **self.as_model_inputs(kwargs))

    def as_model_inputs(self, kwargs: dict[str, object]) -> dict[str, object]:
        """The keyword arguments as the model receives them: tensors on the model's device, the
        processor's floating outputs (:data:`PROCESSOR_FLOAT_KEYS`) in the model's input dtype;
        embeddings and everything else unchanged; order kept."""

        def move(value: object, cast: bool) -> object:
            if isinstance(value, torch.Tensor):
                if cast and value.is_floating_point():
                    return value.to(self.device, self.input_dtype)
                return value.to(self.device)
            if isinstance(value, list):
                return [move(v, cast) for v in value]
            if isinstance(value, tuple):
                return tuple(move(v, cast) for v in value)
            return value

        return {key: move(value, key in PROCESSOR_FLOAT_KEYS) for key, value in kwargs.items()}

    @abc.abstractmethod
    def process_request(self, request: Request) -> ProcessedRequest:
        """The target's processor alone on a request (one processor per model, shared between
        calls and threads, as an engine shares it)."""

    @abc.abstractmethod
    def run_request(self, request: Request, *, cached: bool = False) -> RequestResult:
        """A user's request as the target's engine runs it: its processor expands the prompt and
        makes the model's inputs (through its processor cache when ``cached``), its batching
        groups them, ``embed_multimodal`` embeds each batch. Whatever a step raises propagates;
        an input the target does not implement raises :class:`NotImplementedByTarget`."""

    @abc.abstractmethod
    def request_features(self, request: Request) -> list[ItemFeatures]:
        """The features the target's processor makes of each media item of ``request`` for its
        towers (in prompt order, embeddings given in the request apart), before the engine's
        cast to the model's dtype, so that a front-end difference is not lost in it: fp32
        where the processor computes in fp32 (see
        :class:`~harness.inputs.requests.ItemFeatures`)."""

    @abc.abstractmethod
    def connect(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The target's connector alone on vision features: ``[n, gh*gw, C]`` patch features of
        ``n`` static tiles of ``grid = (gh, gw)`` patches, as the vision tower would hand them
        over, to the ``[n, gh*gw/4, h]`` rows the model gives the language model (the
        connector's own code path, the vision tower's output replaced by ``features``)."""

    def embed_prompt(
        self,
        prompt_token_ids: Sequence[int],
        embeddings: Sequence[torch.Tensor],
        is_multimodal: Sequence[bool],
    ) -> torch.Tensor:
        """The ``[L, h]`` input embeddings the target's model gives its language model for a
        processed prompt: ``embeddings``' rows, in order, merged as the target's engine merges
        them (vLLM: the model's ``embed_input_ids`` with the engine's placeholder mask
        ``is_multimodal``)."""
        ids = torch.tensor(list(prompt_token_ids), device=self.device)
        mask = torch.tensor(list(is_multimodal), device=self.device)
        with torch.no_grad():
            return self._merge(ids, [e.to(self.device) for e in embeddings], mask)

    @abc.abstractmethod
    def _merge(
        self, ids: torch.Tensor, embeddings: list[torch.Tensor], is_multimodal: torch.Tensor
    ) -> torch.Tensor: ...

    @abc.abstractmethod
    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]: ...

    @abc.abstractmethod
    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]: ...


class ProcessorMetadata(abc.ABC):
    """The processing metadata an engine asks before or between requests, each entry point
    counting the processors it constructs (:attr:`constructions`): vLLM PR #38655, building
    the processor in such a path races on the shared tokenizer."""

    #: processors constructed through this object's entry points so far
    constructions: int = 0

    @abc.abstractmethod
    def supports_video(self) -> bool: ...

    @abc.abstractmethod
    def supports_audio(self) -> bool: ...

    @abc.abstractmethod
    def is_dynamic_tiler(self) -> bool: ...

    @abc.abstractmethod
    def supported_limits(self) -> dict[str, int | None]:
        """Items per prompt of each modality (vLLM's names; None: no limit of its own)."""

    @abc.abstractmethod
    def embedding_width(self) -> int | None:
        """The width the data parser requires of precomputed embeddings (None: unchecked)."""

    @abc.abstractmethod
    def routed_keys(self) -> dict[str, str]:
        """The processor's fields config: each keyword output and the modality it is routed
        with."""

    @abc.abstractmethod
    def max_tokens_per_item(self, seq_len: int, counts: dict[str, int]) -> dict[str, int]:
        """The most tokens one item of each modality in ``counts`` can take."""

    @abc.abstractmethod
    def profiling_video_frames(self, seq_len: int, counts: dict[str, int]) -> int:
        """Frames per video of the dummy request the engine profiles memory with."""


class Target(abc.ABC):
    """An implementation under test."""

    #: devices whose tensors this target can run on
    devices: frozenset[str] = frozenset({"cpu"})
    #: the known-deviation file under ``fixtures/deviations/`` that applies to this target
    deviations_name: str = ""
    #: seconds per step of what the target built (``"import"``, then one entry per model
    #: variant), written into the results
    timings: dict[str, dict[str, float]]

    def __init__(self) -> None:
        self.timings = {}
        self._models: dict[tuple[ModelSpec, str, ServingConfig], MultimodalModel] = {}

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

    def runs_on(self, concern: str) -> str:
        """What checks of ``concern`` (a suite's ``concern`` marker) run on for this target:
        one of :data:`harness.runs_on.RUNS_ON`."""
        return FUNCTIONS

    # The model ---------------------------------------------------------------------------

    def model(
        self, spec: ModelSpec, device: torch.device, serving: ServingConfig = DEFAULT_SERVING
    ) -> MultimodalModel:
        """The model of ``spec``'s checkpoint folder served with ``serving``'s options, built
        and loaded by the target's own constructor and loader (:meth:`build_model`) once per
        spec, configuration and device, and shared: each caller gets it with its recorded
        tower calls cleared. The same for every target: the folder is written (or found), the
        build is timed into :attr:`timings`, the model cached."""
        key = (spec, str(device), serving)
        if key not in self._models:
            start = time.perf_counter()
            folder = checkpoint_folder(spec)
            written = time.perf_counter() - start
            model, steps = self.build_model(spec, folder, device, serving)
            name = spec.slug if serving == DEFAULT_SERVING else f"{spec.slug} {serving.name}"
            if device.type != "cpu":
                name += f" on {device}"
            if steps:  # a model shared with another configuration built nothing new
                self.timings[name] = {"checkpoint_s": round(written, 3), **steps}
            self._models[key] = model
        model = self._models[key]
        model.calls.reset()
        return model

    def forget_models(self) -> None:
        """Drop every model built so far (a run over many drawn folders builds each once)."""
        self._models.clear()

    @abc.abstractmethod
    def build_model(
        self, spec: ModelSpec, folder: Path, device: torch.device, serving: ServingConfig
    ) -> tuple[MultimodalModel, dict[str, float]]:
        """Build and load the model of the checkpoint ``folder`` (``spec``'s) served with
        ``serving``, with the target's own constructor and loader; with the seconds each step
        took (empty when nothing was built: a model shared with another configuration)."""

    # Weight loading ----------------------------------------------------------------------

    def load_weights(
        self,
        spec: ModelSpec,
        weights: Iterable[tuple[str, torch.Tensor]],
        *,
        text_only: bool = False,
    ) -> LoadedWeights:
        """Load checkpoint-named ``weights`` (in this order, one at a time, as a loader streams
        them) into a model of ``spec`` through the target's weight loader, and compare every
        tensor with the checkpoint folder's. ``text_only``: every modality limit 0. Whatever
        the loader raises propagates.

        The same measurement for every target: every tensor the loader must set is poisoned
        with NaN, the stream's tower tensors read are recorded, every tensor is read back and
        compared (:func:`compare_read_back`), and every checkpoint tensor the model holds must
        be some tensor's source (:attr:`LoadedWeights.unheld`); a target supplies only its
        fresh model (:meth:`fresh_model`), which says how it builds, loads and names its
        tensors."""
        fresh = self.fresh_model(spec, text_only)
        with torch.no_grad():
            for tensor in fresh.loadable():
                if tensor.is_floating_point():
                    tensor.fill_(float("nan"))  # a tensor the loader leaves alone stays NaN
        reads: list[str] = []
        fresh.load(recording_reads(weights, TOWER_PREFIXES, reads))
        checkpoint = checkpoint_weights(spec)
        read_back = list(fresh.read_back(checkpoint))
        not_loaded, differing = compare_read_back(read_back)
        held = {source for item in read_back for source in item.sources}
        unheld = sorted(set(checkpoint) - held - dropped_by_the_architecture(spec, checkpoint))
        return LoadedWeights(not_loaded, differing, reads, unheld)

    @abc.abstractmethod
    def fresh_model(self, spec: ModelSpec, text_only: bool) -> FreshModel:
        """A model of ``spec`` from the target's constructor, weights not loaded (one per spec
        and mode is enough: every load poisons its tensors first)."""

    @abc.abstractmethod
    def linear_quantization(self, spec: ModelSpec) -> dict[str, str | None]:
        """The linear layers the target's constructor builds for ``spec``'s checkpoint folder
        (its ``quantization_config`` as the target reads it), by checkpoint module name (a
        fused layer under each of its checkpoint parts): the name of the quantization method
        each is built with, None for unquantized. Raises :class:`NotImplementedByTarget` on a target
        without quantization."""

    # Input contracts ---------------------------------------------------------------------

    @abc.abstractmethod
    def validate_contract(self, kind: str, fields: dict[str, object], hidden_size: int) -> None:
        """Build the target's typed input of ``kind`` (vLLM's schema ``type``: "pixel_values",
        "image_embeds", "pixel_values_videos", "video_embeds", "audio_features") from
        ``fields`` (keyed by the processor's keyword names) with validation on; raise if it is
        rejected."""

    # Configs -----------------------------------------------------------------------------

    @abc.abstractmethod
    def mamba_state(self, text_config: NemotronHConfig, tp_size: int) -> MambaStateInfo:
        """The target's Mamba state-shape and dtype helpers for the checkpoint folder's config
        with its language model's fields set to ``text_config``'s, called on an engine config
        that holds a live parameter and refuses to be deep-copied (vLLM PR #38655). Conv shapes
        are reported as ``(channels, window)``."""

    @abc.abstractmethod
    def build_minimal(self, spec: ModelSpec, overrides: dict[str, object]) -> MinimalBuild:
        """Build ``spec``'s checkpoint with config overrides (nested ``text_config`` too) as the
        target applies them (vLLM: ``hf_overrides``), without its weights; run the towers."""

    # Processor ---------------------------------------------------------------------------

    @abc.abstractmethod
    def metadata(
        self, spec: ModelSpec, tokenizer: object, *, fresh: bool = False
    ) -> ProcessorMetadata:
        """The processing metadata of ``spec``'s config, with ``tokenizer`` as the shared one;
        ``fresh``: from a config made for this call alone (else one kept per spec)."""

    @abc.abstractmethod
    def video_replacement(
        self,
        tokenizer: object,
        tokens_per_frame: list[int],
        frames_indices: list[int],
        frame_duration_ms: int | None,
        temporal_patch_size: int,
    ) -> tuple[int, ...]:
        """The token ids that replace one ``<video>`` placeholder, made with ``tokenizer``."""

    @abc.abstractmethod
    def processor_counts(self) -> ProcessorCounts:
        """The target's processor arithmetic for the default checkpoint folder (tile counts,
        dynamic grids, audio tokens)."""

    def image_pixel_limit(self) -> int | None:
        """PIL's pixel limit (``Image.MAX_IMAGE_PIXELS``) in force once the target's modules
        (model, processor, towers) are imported; None: the limit is switched off (vLLM PR
        #47010: a module that switches it off lets any decompression bomb be decoded)."""
        self.load()
        from PIL import Image

        limit = Image.MAX_IMAGE_PIXELS
        return None if limit is None else int(limit)

    # Typing and LoRA ---------------------------------------------------------------------

    @abc.abstractmethod
    def typing_cases(self) -> Path:
        """The folder of this target's typing cases (``fixtures/typing/<name>``)."""

    def typing_shadows(self) -> list[tuple[Path, Path]]:
        """``(installed module file, file under test)`` pairs mypy reads in place of each other
        when it checks the typing cases (``--shadow-file``); none by default."""
        return []

    @abc.abstractmethod
    def lora(self, spec: ModelSpec, options: LoRAOptions) -> LoRAServing:
        """A fresh model of ``spec``'s checkpoint folder served with LoRA ``options`` (its own
        build: the shared model of :meth:`model` stays without LoRA)."""

    @abc.abstractmethod
    def lora_metadata(self) -> LoRAMetadata:
        """The VL class's and its language model class's LoRA attributes."""

    def cache_layout(self, spec: ModelSpec, serving: ServingConfig, platform: str) -> CacheLayout:
        """The caches the target's engine sizes for ``spec`` served with ``serving``, on
        ``platform`` (:data:`CACHE_PLATFORMS`). A target without an engine's caches raises
        :class:`NotImplementedByTarget`."""
        raise NotImplementedByTarget(
            f"target {self.name!r} has no serving engine's caches to size (no KV cache, no "
            "Mamba state pool)"
        )

    # Tensor parallelism ------------------------------------------------------------------

    @abc.abstractmethod
    def tensor_parallel_shards(
        self, spec: ModelSpec, tp_size: int
    ) -> dict[int, dict[str, torch.Tensor]]:
        """``spec``'s model served with ``--tensor-parallel-size tp_size``: for each rank, every
        parameter by the target's own name, as that rank's constructor and loader (the
        target's own, reading the checkpoint folder) filled it; ``tp_size`` 1 gives the
        unsharded parameters. Raises :class:`NotImplementedByTarget` on a target without tensor
        parallelism."""
