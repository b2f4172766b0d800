"""The seed regressions at the engine's level: a minimal-layer configuration given as
``hf_overrides`` built by the engine itself (its Mamba state shapes from the config, the deep
copy of #38655) and served. (Given embeddings through ``multi_modal_data``, #56398, are forms
of :mod:`suites.engine.test_forward`; LM-only LoRA, #56231, is :mod:`suites.engine.test_lora`.)"""

from __future__ import annotations

import json

import pytest

from harness.targets.engine import ENGINE_SPEC, EngineOptions, Sampling, engine_prompt
from suites.engine.conftest import Served, form_request

pytestmark = pytest.mark.concern("engine")

#: Two layers, Mamba then attention, in the form vLLM's own test registry writes for this model
#: and in transformers 5's form of NemotronHConfig; vLLM's dummy weights, as its tests load them.
MINIMAL = {
    "registry-pattern": {"text_config": {"num_hidden_layers": 2, "hybrid_override_pattern": "M*"}},
    "layers-block-type": {
        "text_config": {"layers_block_type": ["linear_attention", "full_attention"]}
    },
}
FORMS = ("text", "images-pil", "mixed")


@pytest.mark.parametrize("case", list(MINIMAL))
def test_a_minimal_layer_override_is_built_and_served_by_the_engine(
    served: Served, case: str
) -> None:
    options = EngineOptions(hf_overrides=json.dumps(MINIMAL[case]), load_format="dummy")
    engine = served.target.engine(ENGINE_SPEC, options)
    for form in FORMS:
        _, request = form_request(form)
        answer = engine.generate([engine_prompt(request)], Sampling(max_tokens=4))[0]
        expected = served.oracle(form).process(request).input_ids
        assert answer.prompt_token_ids == list(expected), (
            f"{form}: the minimal engine's prompt differs from the reference processor's"
        )
        assert len(answer.tokens) == 4
        # vLLM's dummy weights make no model in particular: its numbers are not compared.
        assert all(p is not None for p in answer.prompt_logprobs[1:]), (
            f"{form}: the minimal engine gave no log-probability for some prompt tokens"
        )
        assert answer.prompt_logprobs != served.answer(form).prompt_logprobs, (
            f"{form}: the minimal engine answers as the full model: the override was not applied"
        )
