"""How a user serves the model: the engine options of ``vllm serve``, one object per configuration.

A :class:`ServingConfig` names the options a user sets on the command line that change this
model's path (its dtype, whether embedding inputs are accepted, the per-prompt limits, the
context, the media loader's and the processor's options, the cache dtypes, prefix caching and
tensor parallelism). It is an axis of the checks beside :class:`~harness.checkpoints.spec.ModelSpec`
(which checkpoint folder is served): each target applies it the way ``vllm serve`` does
(vLLM: its own argument parser and ``EngineArgs.create_engine_config``, see
:func:`harness.targets.vllm.build.engine_config`; the reference: the same meaning in its own
terms). :meth:`ServingConfig.cli_args` is the command line a user types, for the report and for
findings.

:data:`DEFAULT_SERVING` is what every check ran on before configurations were an axis: the
checkpoint's own dtype, vLLM's defaults, ``--enable-mm-embeds`` on. The serving checks
(``suites/conformance/test_serving_*.py``) parametrize with the configurations they vary; a check
records the configuration it ran under (``serving`` in the results), and the report groups
results by it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from harness.checkpoints.spec import CheckpointDtype

#: ``--dtype`` values: "auto" serves in the checkpoint's ``torch_dtype``.
DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
#: ``--mamba-ssm-cache-dtype`` values vLLM accepts.
MAMBA_SSM_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: ``--kv-cache-dtype`` values checked here (vLLM accepts more; fp8 needs a GPU).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: Modalities ``--limit-mm-per-prompt`` caps.
LIMITED_MODALITIES = ("image", "video", "audio")

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
#: A mapping option: given as a mapping, kept as its canonical JSON text.
JsonOption = str | Mapping[str, Any]


def _frozen(value: Mapping[str, object] | None, name: str) -> str:
    """A mapping option as canonical JSON (hashable, and what the command line carries)."""
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        raise ValueError(f"ServingConfig.{name}: expected a mapping, got {type(value).__name__}")
    try:
        return json.dumps(dict(value), sort_keys=True)
    except TypeError as e:
        raise ValueError(f"ServingConfig.{name}: expected JSON values, got {value!r}: {e}") from e


@dataclass(frozen=True)
class ServingConfig:
    """The options of one ``vllm serve FOLDER ...`` command that change this model's path.

    Each field is the option of the same name (``max_model_len`` is ``--max-model-len``);
    ``None`` or the default leaves vLLM's default in place, except ``enable_mm_embeds``: on by
    default here (every check before configurations were an axis ran with it), off in vLLM.
    The mapping options are given as mappings and kept as canonical JSON, so a configuration
    is hashable and a key of the models a target builds.
    """

    dtype: Dtype = "auto"
    enable_mm_embeds: bool = True
    limit_mm_per_prompt: JsonOption = ""  # {"image": 1}
    max_model_len: int | None = None  # None: the context the checkpoint's config states
    media_io_kwargs: JsonOption = ""  # {"video": {"num_frames": 4}}
    mm_processor_kwargs: JsonOption = ""  # {"max_num_tiles": 2}
    mamba_ssm_cache_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool | None = None  # None: vLLM's default for the model
    tensor_parallel_size: int = 1
    #: a short name for the report ("" derives one from the options)
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(
                f"ServingConfig.dtype: expected one of {sorted(DTYPES)}, got {self.dtype!r}"
            )
        if self.mamba_ssm_cache_dtype not in MAMBA_SSM_CACHE_DTYPES:
            raise ValueError(
                "ServingConfig.mamba_ssm_cache_dtype: expected one of "
                f"{list(MAMBA_SSM_CACHE_DTYPES)}, got {self.mamba_ssm_cache_dtype!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"ServingConfig.kv_cache_dtype: expected one of {list(KV_CACHE_DTYPES)}, got "
                f"{self.kv_cache_dtype!r}"
            )
        if self.max_model_len is not None and (
            not _is_count(self.max_model_len) or self.max_model_len < 1
        ):
            raise ValueError(
                "ServingConfig.max_model_len: expected a positive int or None, got "
                f"{self.max_model_len!r}"
            )
        if not _is_count(self.tensor_parallel_size) or self.tensor_parallel_size < 1:
            raise ValueError(
                "ServingConfig.tensor_parallel_size: expected a positive int, got "
                f"{self.tensor_parallel_size!r}"
            )
        for name in ("limit_mm_per_prompt", "media_io_kwargs", "mm_processor_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str) and value:  # given as JSON: made canonical the same way
                try:
                    value = json.loads(value)
                except json.JSONDecodeError as e:
                    raise ValueError(
                        f"ServingConfig.{name}: expected a JSON object, got {value!r}: {e}"
                    ) from None
            object.__setattr__(self, name, _frozen(value or None, name))
        for modality, limit in self.limits().items():
            if modality not in LIMITED_MODALITIES or not _is_count(limit) or limit < 0:
                raise ValueError(
                    "ServingConfig.limit_mm_per_prompt: expected counts >= 0 of "
                    f"{list(LIMITED_MODALITIES)}, got {modality!r}: {limit!r}"
                )

    # The options as mappings ------------------------------------------------------------

    def limits(self) -> dict[str, int]:
        """``--limit-mm-per-prompt`` as counts per modality (absent: vLLM's default)."""
        return _loaded(self.text("limit_mm_per_prompt"))

    def media_io(self) -> dict[str, dict[str, object]]:
        """``--media-io-kwargs``: the media loaders' options, per modality."""
        return _loaded(self.text("media_io_kwargs"))

    def processor_kwargs(self) -> dict[str, object]:
        """``--mm-processor-kwargs``: the processor's options."""
        return _loaded(self.text("mm_processor_kwargs"))

    def text(self, name: str) -> str:
        """A mapping option's JSON text ("" when not set)."""
        value = getattr(self, name)
        assert isinstance(value, str), f"{name} is kept as JSON text"
        return value

    def torch_dtype(self) -> torch.dtype | None:
        """``--dtype`` as a torch dtype; None for "auto" (the engine decides: vLLM serves a
        checkpoint in its saved dtype, an fp32 one in its platform's preferred half
        precision)."""
        return DTYPES[self.dtype]

    def model_options(self) -> ServingConfig:
        """This configuration with only the options that change the built model (its dtype,
        context, cache dtypes, parallelism); the others (embeddings accepted, per-prompt
        limits, the media loaders' and the processor's options, prefix caching) act on
        requests, so configurations that differ only in them share one built model."""
        return dataclasses.replace(
            self,
            enable_mm_embeds=True,
            limit_mm_per_prompt="",
            media_io_kwargs="",
            mm_processor_kwargs="",
            enable_prefix_caching=None,
            label="",
        )

    # What the user types ----------------------------------------------------------------

    def cli_args(self) -> list[str]:
        """The ``vllm serve FOLDER`` options of this configuration, in vLLM's spelling, each
        option and its value one argument (``--dtype=float16``: a value such as ``-0.1`` is
        never read as an option)."""
        args = [] if self.dtype == "auto" else [f"--dtype={self.dtype}"]
        if self.enable_mm_embeds:
            args.append("--enable-mm-embeds")
        if self.text("limit_mm_per_prompt"):
            args.append(f"--limit-mm-per-prompt={self.text('limit_mm_per_prompt')}")
        if self.max_model_len is not None:
            args.append(f"--max-model-len={self.max_model_len}")
        for name in ("media_io_kwargs", "mm_processor_kwargs"):
            if self.text(name):
                args.append(f"--{name.replace('_', '-')}={self.text(name)}")
        if self.mamba_ssm_cache_dtype != "auto":
            args.append(f"--mamba-ssm-cache-dtype={self.mamba_ssm_cache_dtype}")
        if self.kv_cache_dtype != "auto":
            args.append(f"--kv-cache-dtype={self.kv_cache_dtype}")
        if self.enable_prefix_caching is not None:
            args.append(
                "--enable-prefix-caching"
                if self.enable_prefix_caching
                else "--disable-prefix-caching"
            )
        if self.tensor_parallel_size != 1:
            args.append(f"--tensor-parallel-size={self.tensor_parallel_size}")
        return args

    def command(self, folder: str = "FOLDER") -> str:
        """The shell command a user runs to serve ``folder`` this way."""
        return shlex.join(["vllm", "serve", folder, *self.cli_args()])

    @property
    def name(self) -> str:
        """The configuration's name in check ids and the report: its label, or the options it
        changes from :data:`DEFAULT_SERVING`."""
        if self.label:
            return self.label
        changed = [arg for arg in self.cli_args() if arg != "--enable-mm-embeds"]
        if not self.enable_mm_embeds:
            changed.insert(0, "(no --enable-mm-embeds)")
        return " ".join(changed) or "default"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _loaded(text: str) -> dict[str, Any]:
    loaded = json.loads(text) if text else {}
    assert isinstance(loaded, dict), text
    return loaded


#: Every check ran on this before configurations were an axis.
DEFAULT_SERVING = ServingConfig()

#: (the dtype a folder is saved in, the configuration): a bf16 checkpoint served as every other
#: check serves it, in fp16 and in fp32; an fp32 checkpoint served with ``auto`` and in each
#: dtype. The served-dtype checks run the non-default ones; the parity calibration all of them.
DTYPE_CASES: tuple[tuple[CheckpointDtype, ServingConfig], ...] = (
    ("bfloat16", DEFAULT_SERVING),
    ("bfloat16", ServingConfig(dtype="float16")),
    ("bfloat16", ServingConfig(dtype="float32")),
    ("float32", ServingConfig(dtype="auto")),
    ("float32", ServingConfig(dtype="bfloat16")),
    ("float32", ServingConfig(dtype="float16")),
    ("float32", ServingConfig(dtype="float32")),
)
