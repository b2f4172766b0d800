"""Whole-model parity through the request path: the target against the reference.

For every catalogued request form, the target's processor and the reference's give the same
prompt token ids and placeholder positions, and the target's embeddings equal the reference's on
the same checkpoint folder. The reference runs in fp32; the tolerance depends on what the target
computes in:

- rows the target copies or looks up without arithmetic must be exact: precomputed embeddings,
  and a video's separator rows (the token embedding of its frame-separator text; the folder's
  weights are bf16, so fp32 and bf16 look-ups agree exactly);
- rows the towers compute (vision, audio): relative Frobenius error per item at most
  :data:`harness.oracles.parity.FP32_BOUND` when the target returns fp32,
  :data:`~harness.oracles.parity.BF16_BOUND` when it returns bf16.
  vLLM builds the folder in its ``torch_dtype`` (bf16) and casts three times on top: pixels to
  ``config.dtype`` in its processing context, the ViT features before the norm and pixel
  shuffle, and Parakeet's output before the projection. bf16 keeps 8 significant bits (unit
  roundoff u = 2^-8 ~ 3.9e-3); every op of the RADIO blocks and the connector rounds once, and
  the errors of a 12-block tower add up like a random walk of a few hundred roundings of
  partially cancelling sign: measured 0.4 to 1.5 % on these folders. The bound, 16u = 6.25 %,
  leaves 4x headroom; an implementation error (a wrong norm, shuffle order or crop) moves the
  rows by their own size (100 % and more).

The connector alone (pixel shuffle and ``mlp1`` on the same vision features) is compared the same
way, so a connector bug is told apart from a tower's. The bounds mean something only where a
path's rows depend on its input: ``test_sensitivity.py`` checks that they do.

Each check records what it measured (``measured`` in the results).
"""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.cache import checkpoint_weights
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.requests import Request, RequestResult
from harness.oracles.parity import parity_bound, relative_error, table_rows
from reference_impl.tokenizer import IMG_CONTEXT, shared_tokenizer
from suites.conformance.test_requests import EMBEDDING_TABLE

pytestmark = pytest.mark.concern("requests")


@pytest.mark.parametrize("form", [f.name for f in REQUEST_FORMS])
def test_request_matches_the_reference(request_runs, reference_runs, form, record_property):
    expected = reference_runs.run(form)
    actual = request_runs.run(form)
    catalogued = FORMS_BY_NAME[form]
    measured = compare_with_reference(actual, expected, catalogued.request, catalogued.spec)
    record_property("measured", measured)


def compare_with_reference(
    actual: RequestResult,
    expected: RequestResult,
    request: Request,
    spec: ModelSpec,
    served: torch.dtype | None = None,
) -> dict[str, object]:
    """Assert that ``actual`` (a target's run of ``request`` on ``spec``'s folder) matches the
    reference's run ``expected`` (fp32): the same prompt and placeholders, given embeddings
    bit-exact (in the served dtype, where the engine casts them), separator rows exact, the
    towers' rows within the parity bound of the dtype they come in; with ``served``, the towers'
    rows must come in that dtype. Returns what was measured, per item."""
    assert actual.prompt_token_ids == expected.prompt_token_ids, (
        f"prompt token ids differ from the reference's: {len(actual.prompt_token_ids)} vs "
        f"{len(expected.prompt_token_ids)} tokens"
    )
    assert actual.items == expected.items, "placeholder positions differ from the reference's"
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    measured: dict[str, object] = {}
    for item, got, want in zip(actual.items, actual.embeddings, expected.embeddings, strict=True):
        name = f"{item.modality}[{item.index}]"
        given = request.embeddings(item.modality)
        if given is not None:
            assert got.dtype in (want.dtype, served), (
                f"{name}: the given embeddings came back in {got.dtype}, neither as given "
                f"({want.dtype}) nor in the served dtype ({served})"
            )
            assert torch.equal(got, want.to(got.dtype)), f"{name}: the given embeddings differ"
            measured[name] = {"exact": True}
            continue
        assert got.shape == want.shape, (
            f"{name}: rows shaped {tuple(got.shape)}, the reference's {tuple(want.shape)}"
        )
        if served is not None:
            assert got.dtype == served, (
                f"{name}: the towers' rows came in {got.dtype}, not the served dtype {served}"
            )
        tokens = torch.tensor([actual.prompt_token_ids[p] for p in item.positions])
        if item.modality != "video":
            computed = torch.ones_like(tokens, dtype=torch.bool)
        elif spec.video_pruning_rate == 0.0:
            computed = tokens == context
        else:
            # EVS: the prompt holds every kept token after the first separator (only the total
            # is known before embedding); the model lays each group's kept rows after its own.
            # The separator rows are then where the reference's rows are token embeddings.
            computed = ~table_rows(want, checkpoint_weights(spec)[EMBEDDING_TABLE])
        text = ~computed
        if text.any():
            assert torch.equal(got[text], want[text].to(got.dtype)), (
                f"{name}: separator rows (token embeddings) differ from the reference's"
            )
        bound = parity_bound(got.dtype)
        error = relative_error(got[computed], want[computed])
        measured[name] = {
            "dtype": str(got.dtype).removeprefix("torch."),
            "relative_error": round(error, 6),
            "bound": bound,
            "separator_rows_exact": int(text.sum()),
        }
        assert error <= bound, (
            f"{name}: relative error {error:.3g} against the reference, bound {bound:.3g} for "
            f"{got.dtype}"
        )
    return measured


@pytest.mark.concern("model")
def test_connector_matches_the_reference(make_model, reference_runs, record_property):
    """Pixel shuffle and ``mlp1`` on the same vision features (bf16-representable, so every
    target starts from the same numbers) against the reference's connector."""
    from suites.conformance.test_sensitivity import CONNECTOR_GRID, connector_features

    features = connector_features(seed=51)
    got = make_model().connect(features, CONNECTOR_GRID)
    reference = reference_runs.target.model(ModelSpec(), torch.device("cpu"))
    want = reference.connect(features, CONNECTOR_GRID)
    assert got.shape == want.shape, (
        f"connector rows {tuple(got.shape)}, reference's {tuple(want.shape)}"
    )
    error, bound = relative_error(got, want), parity_bound(got.dtype)
    record_property(
        "measured",
        {
            "connector": {
                "dtype": str(got.dtype).removeprefix("torch."),
                "relative_error": float(f"{error:.3g}"),
                "bound": bound,
            }
        },
    )
    assert error <= bound, (
        f"connector: relative error {error:.3g} against the reference, bound {bound:.3g}"
    )
