"""vLLM 0.33.0: ``--limit-mm-per-prompt '{"audio": 0}'`` does not stop the audio tracks of a
request's video files (``use_audio_in_video``): they are processed, admitted and encoded.

vLLM checks the per-prompt limits in ``InputProcessingContext.parse_mm_data`` (its
``validate_num_items``), on the items of ``multi_modal_data`` alone. With
``mm_processor_kwargs={"use_audio_in_video": True}``,
``NanoNemotronVLMultiModalProcessor.apply`` then extracts each video file's audio track
(``_extract_audio_from_videos``) and parses the tracks with the plain data parser, which checks
no limit; ``InputProcessor.process_inputs`` (the engine's admission) counts no items either. A
request of two videos with tracks thus carries two audio items to the audio tower of a server
that allows none, while one plain audio item is refused.

Run it with vLLM alone against the checkpoint folder the harness writes (from the repository
root)::

    nemotron-vl-checkpoint /tmp/nnvl-tiny
    python reports/findings/serving_audio_limit_bypassed_by_video_tracks.py /tmp/nnvl-tiny
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import numpy as np
from _processor import AUDIO_RATE, Folders, Served, reproduce_silent, video_file

FOLDERS = Folders()
OPTIONS = ["--limit-mm-per-prompt", '{"audio": 0}']  # as on the vllm serve command line
PROMPT = "Watch <video> and <video>."


def main(argv: Sequence[str] | None = None) -> int:
    from vllm import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    folder, _ = FOLDERS.resolve(argv, __file__)
    served = Served(folder, OPTIONS)  # the engine config `vllm serve FOLDER *OPTIONS` makes
    engine = InputProcessor(served.vllm_config)  # as LLMEngine / AsyncLLM build it
    processor = engine.renderer.get_mm_processor()
    video = video_file(1.0)  # two frames and a one-second tone, in a Matroska file
    data: dict[str, object] = {"video": [(video.frames, video.metadata())] * 2}
    kwargs: dict[str, object] = {"use_audio_in_video": True}

    def wrong() -> str | None:
        t = np.arange(AUDIO_RATE) / AUDIO_RATE
        tone = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
        try:  # the limit is in force: one plain audio item is refused
            processor.info.parse_mm_data({"audio": [(tone, AUDIO_RATE)]})
            plain = "a plain audio item is accepted too"
        except Exception as e:
            plain = f"a plain audio item is refused ({type(e).__name__}: {e})"
        try:
            items = processor.info.parse_mm_data(data)
            processed = processor(PROMPT, items, hf_processor_mm_kwargs=kwargs)
            tracks = len(processed["mm_kwargs"].get("audio", []))
            if tracks == 0:
                print(f"no audio items: {sorted(processed['mm_placeholders'])}")
                return None
            engine.process_inputs(
                "r0", processed, SamplingParams(max_tokens=1), supported_tasks=("generate",)
            )
        except Exception:  # refused: the limit holds
            traceback.print_exc()
            return None
        outputs = served.run(PROMPT, data, kwargs)  # the towers' embeddings, in prompt order
        placed = sorted(
            (placeholder.offset, modality)
            for modality, placeholders in processed["mm_placeholders"].items()
            for placeholder in placeholders
        )
        encoded = [
            tuple(output.shape)
            for (_, modality), output in zip(placed, outputs, strict=True)
            if modality == "audio"
        ]
        return (
            f"--limit-mm-per-prompt audio=0, yet {tracks} audio item(s) from video tracks were "
            f"processed, admitted by InputProcessor.process_inputs and encoded by the audio "
            f"tower (embeddings {encoded}); {plain}"
        )

    return reproduce_silent(wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
