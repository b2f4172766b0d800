"""``vllm serve FOLDER`` with vLLM's own defaults, as a user first runs it: for this hybrid model
that turns prefix caching on (Mamba cache mode 'align', 128-token blocks). A prompt longer than
one block is served as the engine without prefix caching serves it, and the server still
answers ``/health`` afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from harness.oracles.decoding import compare_answers
from harness.oracles.engine_bounds import engine_path_bound
from harness.problems import assert_no_problems
from harness.targets.engine import DEFAULT_OPTIONS, ENGINE_SPEC, EngineTarget
from harness.targets.server import ServerOptions
from suites.engine.conftest import FORM_PATHS, SAMPLING
from suites.server.conftest import Chat, server_request

pytestmark = pytest.mark.concern("server")

#: vLLM's defaults: no prefix-caching flag at all.
VLLM_DEFAULTS = ServerOptions(dataclasses.replace(DEFAULT_OPTIONS, enable_prefix_caching=None))


def test_vllm_serve_with_its_defaults_serves_a_prompt_longer_than_a_block(
    chat: Chat, engine_target: EngineTarget
) -> None:
    request = server_request("mixed")  # about 300 tokens: more than one 128-token block
    expected = chat.engine_answer("mixed")
    assert len(expected.prompt_token_ids) > 128, len(expected.prompt_token_ids)
    server = engine_target.server(ENGINE_SPEC, VLLM_DEFAULTS)
    try:
        served = server.chat(request, SAMPLING)
        assert server.healthy(), "the server stopped answering /health" + server.tail()
    finally:
        engine_target.forget_server(ENGINE_SPEC, VLLM_DEFAULTS)
    # Prefix caching changes the prefill's steps, not the answer: the chunked-prefill bound.
    bound = engine_path_bound("chunked-vs-whole", FORM_PATHS["mixed"]).value
    _, problems = compare_answers(expected, served, bound)
    assert_no_problems(problems, "vllm serve's defaults against the engine: ")
