"""A serving configuration and a request drawn together: whatever options the engine was started
with, a media request is either served whole or refused with an error naming the option it
broke.

The configuration is drawn by :func:`harness.inputs.strategies.serving_configs` (the context, item
limits per modality, the processor's tile limit, embeddings accepted or not); the request by
:func:`harness.inputs.strategies.media_requests` within
:data:`harness.inputs.strategies.REQUEST_BOUNDS`. For
each pair:

- more items of a modality than its limit: refused, naming the limit, before the towers;
- otherwise served, or refused naming ``max_model_len`` (the prompt does not fit the context);
- a served request comes back whole: every item once, in placeholder order, as many rows as its
  placeholder expanded to, the prompt within the context.

Embedding requests are not drawn here: vLLM's processor fails them in every configuration
(pinned in test_request_properties), and their refusal without ``--enable-mm-embeds`` is
test_serving_requests'. Served dtypes are test_serving_dtype's.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import Request
from harness.inputs.strategies import media_requests, serving_configs
from harness.oracles.assertions import assert_refusal
from harness.plugin.hypothesis import REQUEST_EXAMPLES
from harness.plugin.target import RequestRuns
from suites.conformance.test_request_properties import placeholder_order
from suites.conformance.test_requests import MODALITIES, _items_and_rows_agree

pytestmark = pytest.mark.concern("requests")

#: What the results record as this check's configuration: one per example, drawn.
DRAWN = ServingConfig(label="drawn with each request (harness.inputs.strategies.serving_configs)")
SETTINGS = settings(
    max_examples=REQUEST_EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(data=st.data())
def test_any_configuration_serves_or_refuses_a_request_naming_the_option(
    make_model, reference_runs, data, record_property
):
    record_property("serving", DRAWN)
    serving = data.draw(serving_configs(), label="serving")
    model = make_model(serving=serving)
    request = data.draw(media_requests(model.spec), label="request")
    over = {
        modality: limit
        for modality, limit in serving.limits().items()
        if request.expected_items(modality) > limit  # type: ignore[arg-type]
    }
    try:
        result = model.run_request(request)
    except Exception as exc:
        if over:  # any of the limits broken may be the one named
            stated = [f"{limit} {modality}" for modality, limit in over.items()]
            assert_refusal(exc, ["limit-mm-per-prompt", "limit_mm_per_prompt", *stated])
        else:
            assert_refusal(exc, ["max_model_len", "max-model-len"])
            context = serving.max_model_len or model.spec.max_model_len
            needed = _prompt_tokens(reference_runs, model.spec, serving, request)
            assert needed >= context, (
                f"refused for max_model_len, but the reference's processed prompt has {needed} "
                f"tokens, which fit the {context}-token context with one to generate"
            )
        assert model.calls.vision == [], "a tower ran before the refusal"
        assert model.calls.audio == [], "a tower ran before the refusal"
        return
    assert not over, f"served although over the limit {over} ({serving.name})"
    _items_and_rows_agree(request, result, model.spec.hidden_size)
    got = [item.modality for item in result.items]
    assert got == placeholder_order(request.prompt), f"items in the order {got}"
    if serving.max_model_len is not None:
        assert len(result.prompt_token_ids) < serving.max_model_len, (
            f"a {len(result.prompt_token_ids)}-token prompt served in a "
            f"{serving.max_model_len}-token context"
        )
    assert all(m in MODALITIES for m in got)


def _prompt_tokens(
    reference_runs: RequestRuns, spec: ModelSpec, serving: ServingConfig, request: Request
) -> int:
    """The prompt's length once processed, as the reference processes it on ``spec`` under
    ``serving`` (a dynamic tiler's budget depends on the context)."""
    reference = reference_runs.target.model(spec, torch.device("cpu"), serving)
    return len(reference.process_request(request).prompt_token_ids)
