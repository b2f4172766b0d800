"""A minimal-layer model served from the command line, as a CI job serves one (#38655's path):
``vllm serve FOLDER --hf-overrides JSON --load-format dummy`` with two layers, Mamba then
attention. It starts, answers ``/health``, and serves text and image chat requests whose prompts
are the reference processor's for the rendered turn; its answers are not the full model's (the
override was applied). vLLM's dummy weights make no model in particular: the numbers are not
compared with the reference's."""

from __future__ import annotations

import json

import pytest

from suites.server.conftest import (
    MINIMAL_LAYERS,
    RESTRICTED,
    Chat,
    prompt_difference,
    server_request,
)

pytestmark = pytest.mark.concern("server")

#: The restricted server takes two images per prompt.
FORMS = ("text", "images-pil")


def test_the_command_line_carries_the_override() -> None:
    args = RESTRICTED.cli_args()
    at = args.index("--hf-overrides")
    assert json.loads(args[at + 1]) == MINIMAL_LAYERS, args[at + 1]
    assert args[args.index("--load-format") + 1] == "dummy"


@pytest.mark.parametrize("form", FORMS)
def test_a_minimal_layer_server_from_the_command_line_serves_chat(chat: Chat, form: str) -> None:
    served = chat.restricted_answer(form)
    expected = list(chat.oracle.process(chat.rendered(server_request(form))).input_ids)
    differ = prompt_difference(
        chat.tokenizer, served.prompt_token_ids, expected, "the reference processor's"
    )
    assert differ is None, f"{form}: {differ}"
    full = chat.engine_answer(form)  # the full model's, from the engine: no other server
    assert len(served.tokens) == len(full.tokens)
    assert served.prompt_logprobs != full.prompt_logprobs, (
        f"{form}: the minimal-layer server answers as the full model: the override was not applied"
    )
    assert chat.restricted().healthy()
