"""What an engine is built with and asked, and what it answers: the ``vllm serve`` options
(:class:`EngineOptions`), greedy sampling with log-probabilities (:class:`Sampling`), a LoRA
adapter named per request (:class:`Adapter`), a harness request as vLLM's prompt, and one
request's answer (:class:`EngineOutput`).

Glossary: a *prompt* is what ``LLM.generate`` takes (text with its ``multi_modal_data``, or token
ids); an *output* the log-probability of every prompt token, the tokens decoded greedily and
theirs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import Request
from harness.targets.vllm.requests import multi_modal_data, processor_kwargs

#: The KV cache the engine reserves (vLLM's ``--kv-cache-memory-bytes``): set explicitly, since
#: the CPU backend otherwise takes ``--gpu-memory-utilization`` of the machine's memory.
DEFAULT_KV_CACHE_BYTES = 128 * 2**20


@dataclass(frozen=True)
class EngineOptions:
    """The ``vllm serve`` options an engine is built with, beside its folder.

    ``max_num_batched_tokens`` None is vLLM's default budget; below a prompt's length it splits
    the prompt's prefill into chunks of that many tokens (chunked prefill).
    ``enable_prefix_caching`` needs chunked prefill for this hybrid model (vLLM's "mamba cache
    mode 'align'"); None is vLLM's default for the model (on, for this one, under ``vllm
    serve``). ``hf_overrides`` is the JSON vLLM's ``--hf-overrides`` takes.
    """

    max_model_len: int = 2048
    max_num_seqs: int = 8
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = False
    enable_mm_embeds: bool = True
    limit_mm_per_prompt: tuple[tuple[str, int], ...] = ()
    enable_lora: bool = False
    max_loras: int = 2
    max_cpu_loras: int | None = None
    max_lora_rank: int = 8
    hf_overrides: str | None = None
    dtype: str = "bfloat16"
    mm_processor_cache_gb: float | None = None
    #: vLLM's ``--load-format``: "dummy" for random weights (minimal-layer builds, as vLLM's own
    #: tests build them), None for the folder's.
    load_format: str | None = None
    #: Serving options a checkpoint variant names (:func:`for_spec` sets them from the spec):
    #: EVS's ``--video-pruning-rate`` and the processor's ``--mm-processor-kwargs``.
    video_pruning_rate: float = 0.0
    mm_processor_kwargs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "kv_cache_memory_bytes", "max_loras"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineOptions.{name}: expected a positive int, got {value!r}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                "EngineOptions.max_num_batched_tokens: expected a positive int or None, got "
                f"{self.max_num_batched_tokens!r}"
            )
        if self.hf_overrides is not None:
            try:
                json.loads(self.hf_overrides)
            except ValueError as e:
                raise ValueError(
                    f"EngineOptions.hf_overrides: expected JSON, got {self.hf_overrides!r}"
                ) from e

    def llm_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM``'s keyword arguments for these options (each its ``vllm serve`` flag)."""
        kwargs: dict[str, Any] = {
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "enable_mm_embeds": self.enable_mm_embeds,
        }
        if self.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = self.enable_prefix_caching
        if self.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.enable_chunked_prefill is not None:
            kwargs["enable_chunked_prefill"] = self.enable_chunked_prefill
        if self.limit_mm_per_prompt:
            kwargs["limit_mm_per_prompt"] = dict(self.limit_mm_per_prompt)
        if self.enable_lora:
            kwargs |= {
                "enable_lora": True,
                "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank,
            }
            if self.max_cpu_loras is not None:
                kwargs["max_cpu_loras"] = self.max_cpu_loras
        if self.hf_overrides is not None:
            kwargs["hf_overrides"] = json.loads(self.hf_overrides)
        if self.mm_processor_cache_gb is not None:
            kwargs["mm_processor_cache_gb"] = self.mm_processor_cache_gb
        if self.load_format is not None:
            kwargs["load_format"] = self.load_format
        if self.video_pruning_rate:
            kwargs["video_pruning_rate"] = self.video_pruning_rate
        if self.mm_processor_kwargs:
            kwargs["mm_processor_kwargs"] = dict(self.mm_processor_kwargs)
        return kwargs

    def for_spec(self, spec: ModelSpec) -> EngineOptions:
        """These options with the serving options ``spec`` names (its EVS rate and its
        processor's options), as ``vllm serve`` is given them beside the folder."""
        return dataclasses.replace(
            self,
            video_pruning_rate=spec.video_pruning_rate,
            mm_processor_kwargs=tuple(sorted(spec.processor_options.items())),
        )

    def cli_args(self) -> list[str]:
        """The same options as ``vllm serve`` flags (for reports and reproductions)."""
        args: list[str] = []
        for key, value in self.llm_kwargs().items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is False:
                args.append("--no-" + flag.removeprefix("--"))
            else:
                text = json.dumps(value) if isinstance(value, dict) else str(value)
                args += [flag, text]
        return args


@dataclass(frozen=True)
class Sampling:
    """Greedy sampling of ``max_tokens`` tokens, with the top ``logprobs`` log-probabilities of
    each decoded token and of every prompt token (``prompt_logprobs``, None for none).

    ``read_prefix_cache`` False is vLLM's default for a request that asks for prompt
    log-probabilities (``SamplingParams.skip_reading_prefix_cache``): such a request never
    reads the prefix cache; True asks it to."""

    max_tokens: int = 8
    logprobs: int = 2
    prompt_logprobs: int | None = 1
    read_prefix_cache: bool | None = None
    ignore_eos: bool = True

    def params(self) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=0.0,
            max_tokens=self.max_tokens,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            ignore_eos=self.ignore_eos,
            skip_reading_prefix_cache=(
                None if self.read_prefix_cache is None else not self.read_prefix_cache
            ),
        )


@dataclass(frozen=True)
class EngineOutput:
    """One request's answer: the prompt's token ids, the log-probability the engine gave each
    prompt token after those before it (None for the first), the decoded tokens, each one's
    log-probability and its runner-up's (the top-2 margin), and how many prompt tokens came
    from the prefix cache."""

    prompt_token_ids: list[int]
    prompt_logprobs: list[float | None]
    tokens: list[int]
    token_logprobs: list[float]
    runner_up_logprobs: list[float | None]
    num_cached_tokens: int
    finish_reason: str | None
    #: How often the scheduler preempted the request (its own statistics).
    preemptions: int = 0

    @classmethod
    def of(cls, output: Any) -> EngineOutput:
        """The output of vLLM's ``RequestOutput``."""
        ids = list(output.prompt_token_ids or [])
        prompt: list[float | None] = []
        for position, entry in enumerate(output.prompt_logprobs or [None] * len(ids)):
            prompt.append(None if entry is None else float(entry[ids[position]].logprob))
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        chosen: list[float] = []
        runner_up: list[float | None] = []
        for token, entry in zip(tokens, completion.logprobs or [], strict=False):
            chosen.append(float(entry[token].logprob))
            others = sorted((lp.logprob for t, lp in entry.items() if t != token), reverse=True)
            runner_up.append(float(others[0]) if others else None)
        stats = getattr(output, "metrics", None)
        return cls(
            ids,
            prompt,
            tokens,
            chosen,
            runner_up,
            int(output.num_cached_tokens or 0),
            completion.finish_reason,
            int(getattr(stats, "num_preemptions", 0) or 0),
        )


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter folder served under a name and an integer id (vLLM's ``LoRARequest``)."""

    name: str
    adapter_id: int
    folder: Path

    def request(self) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.adapter_id, str(self.folder))


def engine_prompt(request: Request) -> dict[str, object]:
    """vLLM's prompt for a harness request: its text, ``multi_modal_data`` (media or given
    embeddings) and its own ``mm_processor_kwargs``."""
    prompt: dict[str, object] = {"prompt": request.prompt}
    data = multi_modal_data(request)
    if data:
        prompt["multi_modal_data"] = data
    kwargs = processor_kwargs(request)
    if kwargs:
        prompt["mm_processor_kwargs"] = kwargs
    return prompt


def token_prompt(token_ids: Sequence[int]) -> dict[str, object]:
    return {"prompt_token_ids": list(token_ids)}


#: The options an engine is built with unless a check names others.
DEFAULT_OPTIONS = EngineOptions()
#: The engine whose scheduler does the most: prefix caching (which this hybrid model serves only
#: with chunked prefill; it also makes the KV blocks 128 tokens, where without it a block holds
#: a whole context and no request ever needs a second), prefill in chunks of 64 tokens, and a KV
#: cache of 256 KiB: four and a half blocks, so that a batch of requests longer than a block
#: preempts (the smallest cache that holds one request of the 512-token context).
SCHEDULED_OPTIONS = EngineOptions(
    max_model_len=512,
    max_num_seqs=8,
    kv_cache_memory_bytes=256 * 2**10,
    enable_prefix_caching=True,
    enable_chunked_prefill=True,
    max_num_batched_tokens=64,
)
#: The sampling a request gets unless a check names another.
DEFAULT_SAMPLING = Sampling()
