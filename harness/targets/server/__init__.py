"""vLLM's OpenAI-compatible server as users call it: ``vllm serve`` of the CPU build on
127.0.0.1, one per checkpoint folder and serving configuration, asked through the official
``openai`` client.

:mod:`.options` says what a server is started with (:class:`ServerOptions`); :mod:`.process`
starts, asks and stops one (:class:`Server`: its whole process group); :mod:`.pool` keeps them
per configuration for the checks that share them; :mod:`.requests` writes a harness request as
the API's body and reads its answer back as the engine's
(:class:`~harness.targets.engine.EngineOutput`); :mod:`.forms` holds the requests the checks
and the load run send.
"""

from harness.targets.server.options import DEFAULT_SERVER, SERVED_MODEL, ServerOptions
from harness.targets.server.pool import ServerPool
from harness.targets.server.process import Server, ServerError
from harness.targets.server.requests import ServerRequestError, chat_body, content_parts

__all__ = [
    "DEFAULT_SERVER",
    "SERVED_MODEL",
    "Server",
    "ServerError",
    "ServerOptions",
    "ServerPool",
    "ServerRequestError",
    "chat_body",
    "content_parts",
]
