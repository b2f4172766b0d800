"""Servers kept per checkpoint folder and serving configuration: started on first use, shared
by every check that uses that configuration, at most :data:`LIVE_SERVERS` running at once (the
least recently used is stopped to make room, once the new configuration is known to be
accepted), started again when one has died, all stopped when the checks end."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from harness.targets.engine.engine import Engine, EngineError
from harness.targets.server.options import ServerOptions
from harness.targets.server.process import Server, ServerError

#: Servers running at once. Each is an API server, an engine core and a worker, about 3 GiB
#: of resident memory, counted in the target's memory limit (12 GiB by default) beside the
#: checks' process and its engines: one at a time, and the checks ordered so that few need
#: another (``suites/server``'s modules run in the order of their configurations).
LIVE_SERVERS = 1


class ServerPool:
    """Running servers by folder and options; ``environment`` gives what their processes get
    besides the checks' environment (a target's files under test)."""

    def __init__(self, environment: Callable[[], dict[str, str]]) -> None:
        self._environment = environment
        self._servers: OrderedDict[tuple[Path, ServerOptions], Server] = OrderedDict()
        self._lock = threading.RLock()
        #: Seconds each server took to answer ``/health``, by its command line.
        self.start_seconds: dict[str, float] = {}
        #: Server processes killed because they outlived their stop.
        self.killed: list[str] = []

    def server(self, folder: Path, options: ServerOptions) -> Server:
        key = (folder, options)
        with self._lock:
            server = self._servers.get(key)
            if server is not None and not server.alive:
                self._stop(key)
                server = None
            if server is None:
                try:
                    Engine.configure(folder, options.engine)
                except EngineError as e:
                    raise ServerError(f"vllm serve {folder.name}: {e}") from e
                while len(self._servers) >= LIVE_SERVERS:
                    self._stop(next(iter(self._servers)))
                server = Server.start(folder, options, environment_added=self._environment())
                self.start_seconds[server.command] = round(server.start_seconds, 3)
                self._servers[key] = server
            self._servers.move_to_end(key)
            return server

    def forget(self, folder: Path, options: ServerOptions) -> None:
        """Stop the server of ``folder`` and ``options`` (the next use starts another)."""
        with self._lock:
            if (folder, options) in self._servers:
                self._stop((folder, options))

    def _stop(self, key: tuple[Path, ServerOptions]) -> None:
        self.killed += self._servers.pop(key).stop()

    def shutdown(self) -> None:
        """Stop every server, each whole process group."""
        with self._lock:
            while self._servers:
                self._stop(next(iter(self._servers)))
