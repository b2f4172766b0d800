"""Chat and completion requests through vLLM's OpenAI-compatible server, with the official
``openai`` client: every media form the API carries (images, a video file, audio, all mixed, a
video file with its audio track, given embeddings), as data URLs, streamed, and as local files;
text prompts and token ids through ``/v1/completions``; a video file's audio track at every rate
and channel layout the engine's own checks use.

Each answer is the engine's (``vllm.LLM`` with the same options) for the prompt the chat
template renders, within the batching bound (``batched-vs-alone``: the server batches as it
likes); the prompt's token ids are the reference processor's for that rendered prompt.
"""

from __future__ import annotations

import pytest

from harness.inputs.media import video_file
from harness.inputs.requests import PLACEHOLDER, Request
from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import engine_bound
from harness.problems import assert_no_problems
from harness.targets.engine import DEFAULT_OPTIONS, ENGINE_SPEC, EngineTarget, engine_prompt
from harness.targets.engine.options import Sampling
from harness.targets.server.requests import chat_body, sent
from reference_impl.tokenizer import AUDIO_CONTEXT, AUDIO_END, AUDIO_START
from suites.conformance.test_audio_in_video import TRACK_FORMATS
from suites.conformance.test_media_limits import audio_placeholders
from suites.engine.conftest import SAMPLING, TEXT
from suites.server.conftest import (
    CHAT_FORMS,
    Chat,
    Measure,
    prompt_difference,
    server_request,
    without_prompt_logprobs,
)

pytestmark = pytest.mark.concern("server")

#: Given embeddings (``--enable-mm-embeds``, the default server's): the API's ``image_embeds``
#: and ``video_embeds`` parts.
EMBEDS_FORMS = ("image-embeds-stacked", "video-embeds-list")
DELIVERIES = ("data-url", "stream", "local-file")
#: Forms whose media a local file can carry (given embeddings have no file form).
FILE_FORMS = ("images-pil", "video-file", "audios", "mixed")


def _cases() -> list[tuple[str, str]]:
    cases = [(form, "data-url") for form in (*CHAT_FORMS, *EMBEDS_FORMS)]
    cases += [(form, "stream") for form in CHAT_FORMS]
    cases += [(form, "local-file") for form in FILE_FORMS]
    return cases


@pytest.mark.parametrize(("form", "delivery"), _cases(), ids=[f"{f}-{d}" for f, d in _cases()])
def test_a_chat_request_answers_as_the_engine(
    chat: Chat, form: str, delivery: str, measure: Measure
) -> None:
    served = chat.served(form, delivery)
    expected = chat.engine_answer(form)
    if delivery == "stream":
        expected = without_prompt_logprobs(expected)
    differ = prompt_difference(
        chat.tokenizer, served.prompt_token_ids, expected.prompt_token_ids, "the engine's"
    )
    assert differ is None, f"{form} ({delivery}): {differ}"
    bound = engine_bound("batched-vs-alone").value
    difference, problems = compare_answers(expected, served, bound)
    folder = chat.media_folder if delivery == "local-file" else None
    body = chat_body(server_request(form), SAMPLING, media_folder=folder)
    measure(
        f"{form} {delivery}",
        {
            "sent": sent(body) + ("; streamed" if delivery == "stream" else ""),
            "prompt_tokens": len(served.prompt_token_ids),
            "tokens": len(served.tokens),
            "largest_logprob_difference": difference,
            "bound": bound,
        },
    )
    assert_no_problems(problems, f"{form} ({delivery}) against the engine: ")
    assert served.finish_reason == "length", served.finish_reason


@pytest.mark.parametrize("form", CHAT_FORMS)
def test_the_chat_template_renders_the_reference_processors_prompt(chat: Chat, form: str) -> None:
    served = chat.served(form)
    expected = list(chat.oracle.process(chat.rendered(server_request(form))).input_ids)
    differ = prompt_difference(
        chat.tokenizer, served.prompt_token_ids, expected, "the reference processor's"
    )
    assert differ is None, f"{form}, rendered by the chat template: {differ}"


@pytest.mark.parametrize("prompt", ["text", "token-ids"])
def test_a_completion_answers_as_the_engine(
    chat: Chat, engine_target: EngineTarget, prompt: str, measure: Measure
) -> None:
    engine = engine_target.engine(ENGINE_SPEC, DEFAULT_OPTIONS)
    expected = engine.generate([engine_prompt(TEXT)], SAMPLING)[0]
    sent = TEXT.prompt if prompt == "text" else expected.prompt_token_ids
    served = chat.server().complete(sent, SAMPLING)
    bound = engine_bound("batched-vs-alone").value
    difference, problems = compare_answers(expected, served, bound)
    measure(f"completion {prompt}", {"largest_logprob_difference": difference, "bound": bound})
    assert_no_problems(problems, f"/v1/completions ({prompt}) against the engine: ")


@pytest.mark.parametrize(
    ("rate", "channels"), TRACK_FORMATS, ids=[f"{r}hz-{c}ch" for r, c in TRACK_FORMATS]
)
def test_a_video_files_track_has_its_length(
    chat: Chat, rate: int, channels: int, measure: Measure
) -> None:
    """A video file's 2 s track (``use_audio_in_video``), stored at another rate or in two
    channels, is 2 s of audio to the chat API: the architecture's placeholder count for 2 s at
    the model's 16 kHz, inside the track's ``<so_start> ... <so_end>`` run."""
    video = video_file(2, 64, 64, 52, audio_seconds=2.0, audio_rate=rate, audio_channels=channels)
    request = Request(f"Watch {PLACEHOLDER['video']}.", videos=[video], audio_in_video=True)
    served = chat.server().chat(request, Sampling(max_tokens=1, logprobs=0, prompt_logprobs=None))
    ids = served.prompt_token_ids
    start, end, audio = chat.tokenizer.convert_tokens_to_ids(
        [AUDIO_START, AUDIO_END, AUDIO_CONTEXT]
    )
    assert start in ids, f"no {AUDIO_START} in the prompt {ids}"
    assert end in ids, f"no {AUDIO_END} in the prompt {ids}"
    count = ids[ids.index(start) : ids.index(end)].count(audio)
    expected = audio_placeholders(2.0)
    layout = "mono" if channels == 1 else "stereo"
    measure(
        f"track {rate} Hz {layout}",
        {"sent": sent(chat_body(request, SAMPLING)), "placeholders": count},
    )
    assert count == expected, (
        f"audio placeholders of a 2 s track stored at {rate} Hz {layout}: expected {expected}, "
        f"got {count}"
    )
