"""What a server is started with: the engine's ``vllm serve`` options (:class:`EngineOptions`)
plus those only the server has (adapters served by name, the local media folder, runtime
adapter loading)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.targets.engine.options import DEFAULT_OPTIONS, EngineOptions

#: The name every server serves its model under (``--served-model-name``).
SERVED_MODEL = "nemotron-vl"
#: The variable vLLM reads to allow loading and unloading adapters through its endpoints.
RUNTIME_LORA_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
#: The variable that turns vLLM's development endpoints on.
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


@dataclass(frozen=True)
class ServerOptions:
    """A serving configuration: ``engine``'s options, the adapters served from the start
    (``--lora-modules NAME=FOLDER``, ``engine.enable_lora`` required), the folder a request may
    name local media files in (``--allowed-local-media-path``), whether adapters may be loaded
    and unloaded while it runs (:data:`RUNTIME_LORA_UPDATING_ENV`), and whether a request may
    set its own processor options."""

    engine: EngineOptions = DEFAULT_OPTIONS
    lora_modules: tuple[tuple[str, Path], ...] = ()
    allowed_local_media_path: Path | None = None
    runtime_lora_updating: bool = False
    #: ``--trust-request-mm-kwargs``: a request's own ``mm_processor_kwargs`` (its tile limit,
    #: ``use_audio_in_video``) are refused without it.
    trust_request_mm_kwargs: bool = False
    #: vLLM's development endpoints (``VLLM_SERVER_DEV_MODE``), among them ``/pause`` and
    #: ``/resume``, and each request logged as it is added (``--enable-log-requests``): a check
    #: holds the scheduler until its requests are all queued, so that they are scheduled
    #: together whatever the order and timing of their arrival.
    dev_mode: bool = False

    def __post_init__(self) -> None:
        if (self.lora_modules or self.runtime_lora_updating) and not self.engine.enable_lora:
            raise ValueError(
                "ServerOptions.engine.enable_lora: expected True with lora_modules or "
                f"runtime_lora_updating, got {self.engine.enable_lora!r}"
            )
        names = [name for name, _ in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError(f"ServerOptions.lora_modules: expected unique names, got {names}")
        if self.allowed_local_media_path is not None and not self.allowed_local_media_path.is_dir():
            raise ValueError(
                "ServerOptions.allowed_local_media_path: expected a folder, got "
                f"{self.allowed_local_media_path!s}"
            )

    def cli_args(self) -> list[str]:
        """The server's flags beside ``--model``, ``--host`` and ``--port``: the engine's own
        as :class:`~harness.targets.engine.engine.Engine` builds it (eager, seed 0, the folder's
        code trusted), then the server's."""
        args = [
            "--trust-remote-code",
            "--enforce-eager",
            "--seed",
            "0",
            "--served-model-name",
            SERVED_MODEL,
            *self.engine.cli_args(),
        ]
        if self.lora_modules:
            args += ["--lora-modules", *(f"{name}={folder}" for name, folder in self.lora_modules)]
        if self.allowed_local_media_path is not None:
            args += ["--allowed-local-media-path", str(self.allowed_local_media_path)]
        if self.trust_request_mm_kwargs:
            args.append("--trust-request-mm-kwargs")
        if self.dev_mode:
            args.append("--enable-log-requests")
        return args

    def environment(self) -> dict[str, str]:
        """What the server's processes are started with besides the checks' environment."""
        added = {RUNTIME_LORA_UPDATING_ENV: "True"} if self.runtime_lora_updating else {}
        return added | ({DEV_MODE_ENV: "1"} if self.dev_mode else {})


#: The configuration a check is served under unless it names another.
DEFAULT_SERVER = ServerOptions()
