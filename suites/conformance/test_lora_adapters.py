"""LoRA adapters as users serve them, through the target's own LoRA machinery (vLLM PR #56231).

The adapters are PEFT folders written for the checkpoint folder
(:mod:`harness.checkpoints.lora_adapters`). Each target loads them with its own loader into its own
LoRA layers (vLLM: the model runner's ``LRUCacheWorkerLoRAManager`` on a model built with
``LoRAConfig``), and serves batches whose tokens map to different adapters and to none. Expected
values come from the adapter files and the checkpoint's weights, never from the target, except where
the towers must run as without
LoRA (those two checks compare with the same target's model without LoRA, and say so):

- an adapter is applied to exactly the language-model modules its file names;
- an adapter that names tower or connector modules (RADIO, Parakeet, ``mlp1``) is refused with
  a clear error naming one, or loaded with the towers left alone and the user told which of its
  modules were ignored;
- each adapted linear layer computes ``W x + s B A x`` per token with its own adapter's factors
  and scaling (``s = alpha / r``, rsLoRA ``alpha / sqrt(r)``), ``W x`` for tokens without one;
- the token embedding adds ``s (B A[:, token])`` to its adapter's tokens;
- a video's marker tokens (frame separators, ``<img>``, ``</img>``), made inside the model and
  absent from the token mapping, come from the base embedding while an adapter that trains the
  embedding is active: the video's rows equal the model's without LoRA, called directly and in
  a request through the request path (mixed with images and audio; temporal patch 1 and 2);
- a broken adapter (rank above ``max_lora_rank``, a module the model lacks, a corrupt or missing
  weights file, added tokens) is refused with a clear error naming its folder and what is wrong,
  nothing of it loaded, the adapters loaded before untouched;
- adding, serving and removing adapters in any order, with fewer slots than adapters (LRU
  eviction), never serves a token another adapter's weights.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.checkpoints.cache import checkpoint_weights
from harness.checkpoints.lora_adapters import (
    ADAPTERS_BY_NAME,
    BROKEN_ADAPTERS,
    EMBEDDING_MODULE,
    PEFT_PREFIX,
    AdapterSpec,
    adapter_folder,
    adapter_tensors,
    write_broken_adapter,
)
from harness.checkpoints.spec import ModelSpec
from harness.inputs import model_kwargs
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.oracles.assertions import assert_clear_error
from harness.targets.base import LoRAOptions, LoRAServing

pytestmark = pytest.mark.concern("lora")

SPEC = ModelSpec()
#: Where LoRA-served models are built (the targets' ``lora`` builds on the CPU).
CPU = torch.device("cpu")
#: Three adapters of different ranks and scalings in one batch, and tokens without one.
BATCH_ADAPTERS = ("lm-projections", "rank-4", "rslora")
TOKEN_ADAPTERS = (1, 2, 3, 0, 1, 2, 3, 0)
#: A linear layer's output against ``W x + s B A x`` in fp64, per token (relative): bf16 keeps
#: 8 bits, and the layer rounds its output once and its delta's two products (measured 0.25 to
#: 0.30 % on vLLM); fp32 far below. A dropped or doubled scaling moves a token by its delta,
#: about 8 % of the output here.
LORA_BOUND = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-5}
LM_PREFIX = "language_model."


@functools.cache
def adapter_modules(adapter: AdapterSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The adapter file's ``(A, B)`` per module, by the module name the file uses (made once;
    never changed in place)."""
    tensors = adapter_tensors(SPEC, adapter)
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in tensors:
        for a_suffix, b_suffix in (
            (".lora_A.weight", ".lora_B.weight"),
            (".lora_embedding_A", ".lora_embedding_B"),
        ):
            if key.endswith(a_suffix):
                stem = key.removesuffix(a_suffix)
                modules[stem.removeprefix(PEFT_PREFIX)] = (tensors[key], tensors[stem + b_suffix])
    return modules


def token_errors(
    served: LoRAServing, module: str, ids: Sequence[int], adapters: dict[int, AdapterSpec]
) -> tuple[torch.Tensor, torch.dtype]:
    """``module``'s output for tokens served with adapter ``ids`` against ``W x + s B A x`` per
    token (``W x`` without an adapter), in fp64 from the checkpoint's weight and the adapter
    files: the relative error of each token, and the dtype the target computed in."""
    weight = checkpoint_weights(SPEC)[f"{module}.weight"].double()
    g = torch.Generator().manual_seed(60)
    x = torch.randn(len(ids), weight.shape[1], generator=g).bfloat16()
    expected = x.double() @ weight.t()
    for row, adapter_id in enumerate(ids):
        factors = adapter_modules(adapters[adapter_id]).get(module) if adapter_id else None
        if factors is not None:  # an adapter that does not name the module adds nothing to it
            a, b = (t.double() for t in factors)
            expected[row] += adapters[adapter_id].scaling * (b @ (a @ x[row].double()))
    got = served.linear(module, x, ids)
    return (got.double() - expected).norm(dim=1) / expected.norm(dim=1), got.dtype


def serves_its_adapters(
    served: LoRAServing, module: str, ids: list[int], adapters: dict[int, AdapterSpec]
) -> str | None:
    """What is wrong with ``module``'s output for tokens served with ``ids`` (None: nothing)."""
    errors, dtype = token_errors(served, module, ids, adapters)
    worst = int(errors.argmax())
    if float(errors[worst]) <= LORA_BOUND[dtype]:
        return None
    return (
        f"{module}: token {worst} (adapter {ids[worst]}) is {float(errors[worst]):.3g} from its "
        f"adapter's W x + s B A x"
    )


#: The language model's projections, by their last name (one module each in the folder).
PROJECTIONS = (
    "in_proj",
    "out_proj",
    "up_proj",
    "down_proj",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
)


def names_module(message: str, module: str) -> bool:
    """Whether ``message`` names ``module``: its whole checkpoint name, or its tower (the
    name's first part) and its own name (the last) as words, as a target naming the module in
    its own terms would."""
    if module in message:
        return True
    words = set(re.findall(r"[A-Za-z0-9_]+", message))
    first, last = module.split(".")[0], module.rpartition(".")[2]
    return first in words and last in words


def checkpoint_name(module: str) -> str:
    """A module as the checkpoint names it (an adapter may use vLLM's names)."""
    return module.replace("language_model.model.", "language_model.backbone.").replace(
        ".embed_tokens", ".embeddings"
    )


@pytest.mark.parametrize("name", ["lm-projections", "rank-4", "rslora", "lm-embeddings-vllm-names"])
def test_an_adapter_is_applied_to_exactly_its_modules(target, name):
    adapter = ADAPTERS_BY_NAME[name]
    served = target.lora(SPEC, LoRAOptions())
    load = served.add(1, adapter_folder(SPEC, adapter))
    expected = sorted(checkpoint_name(m) for m in adapter_modules(adapter))
    assert load.applied == expected, (
        f"{name}: applied to {load.applied}, the file adapts {expected}"
    )


@pytest.mark.parametrize("name", ["with-towers", "towers-only", "towers-and-connector"])
def test_tower_modules_are_refused_or_reported(target, name):
    """An adapter naming tower or connector modules: a clear error naming one of them, or the
    language model's modules applied, the towers left alone, and every tower module named in
    what the target says while loading."""
    adapter = ADAPTERS_BY_NAME[name]
    modules = adapter_modules(adapter)
    towers = sorted(m for m in modules if not m.startswith(LM_PREFIX))
    language = sorted(m for m in modules if m.startswith(LM_PREFIX))
    served = target.lora(SPEC, LoRAOptions())
    try:
        load = served.add(1, adapter_folder(SPEC, adapter))
    except Exception as e:
        assert_clear_error(e, towers)
        return
    assert load.applied == language, (
        f"{name}: applied to {load.applied}; the language model's modules of the file are "
        f"{language}"
    )
    unnamed = [m for m in towers if not any(names_module(message, m) for message in load.told)]
    assert not unnamed, (
        f"{name}: loaded with {len(towers)} tower modules left unadapted, and the user was told "
        f"of none of {unnamed[:3]}... (said: {load.told[:3]})"
    )


@pytest.fixture(scope="module")
def batch_serving(target) -> LoRAServing:
    """Three adapters loaded into one LoRA-served model (three slots)."""
    served = target.lora(SPEC, LoRAOptions(max_loras=3))
    for adapter_id, name in enumerate(BATCH_ADAPTERS, start=1):
        served.add(adapter_id, adapter_folder(SPEC, ADAPTERS_BY_NAME[name]))
    return served


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_each_adapted_layer_adds_its_tokens_delta(batch_serving, projection, record_property):
    adapters = {i + 1: ADAPTERS_BY_NAME[name] for i, name in enumerate(BATCH_ADAPTERS)}
    (module,) = [m for m in adapter_modules(adapters[1]) if m.endswith(f".{projection}")]
    errors, dtype = token_errors(batch_serving, module, TOKEN_ADAPTERS, adapters)
    bound = LORA_BOUND[dtype]
    record_property(
        "measured",
        {module: {"kind": "lora", "max_token_error": float(f"{errors.max():.3g}"), "bound": bound}},
    )
    worst = int(errors.argmax())
    assert float(errors[worst]) <= bound, (
        f"{module}: token {worst} (adapter {TOKEN_ADAPTERS[worst]}) is {float(errors[worst]):.3g} "
        f"from W x + s B A x (relative), bound {bound:.3g} for {dtype}"
    )


@pytest.mark.parametrize("name", ["lm-embeddings", "lm-embeddings-vllm-names"])
def test_text_tokens_get_their_adapters_embedding_delta(target, name):
    adapter = ADAPTERS_BY_NAME[name]
    served = target.lora(SPEC, LoRAOptions())
    served.add(1, adapter_folder(SPEC, adapter))
    ids, adapters = [5, 6, 7, 8, 9], [1, 0, 1, 1, 0]
    table = checkpoint_weights(SPEC)[EMBEDDING_MODULE + ".weight"].double()
    a, b = (t.double() for t in adapter_modules(adapter)[adapter.embedding_name])
    expected = table[ids].clone()
    for row, (token, adapter_id) in enumerate(zip(ids, adapters, strict=True)):
        if adapter_id:
            expected[row] += adapter.scaling * (b @ a[:, token])
    embedded = served.embed(ids, adapters)
    bound = LORA_BOUND[embedded.dtype]
    errors = (embedded.double() - expected).norm(dim=1) / expected.norm(dim=1)
    assert float(errors.max()) <= bound, (
        f"{name}: embeddings {errors.tolist()} from E[token] + s B A[:, token] (relative), "
        f"bound {bound:.3g}"
    )


@pytest.mark.self_consistency("the LoRA-served model against the same target's model without LoRA")
@pytest.mark.parametrize("temporal", [1, 2])
def test_video_markers_come_from_the_base_embedding_under_an_adapter(target, temporal):
    """An adapter that trains the embedding is active for a short prompt; the video's frame
    separators and ``<img>`` / ``</img>`` have no mapping entry and must not go through the LoRA
    embedding: the video's rows equal the model's without LoRA."""
    spec = ModelSpec(video_temporal_patch_size=temporal)
    served = target.lora(spec, LoRAOptions())
    served.add(1, adapter_folder(spec, ADAPTERS_BY_NAME["lm-embeddings-vllm-names"]))
    plain = target.model(spec, CPU)  # LoRA-served models are built on the CPU
    group = model_kwargs.video_pixels(spec, [3, 2])
    expected = plain.embed_multimodal(**group.kwargs)
    got = served.embed_multimodal([1] * 4, **plain.as_model_inputs(group.kwargs))
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.shape == b.shape, f"video {i}: {tuple(a.shape)}, without LoRA {tuple(b.shape)}"
        assert torch.equal(a, b), (
            f"video {i}: rows differ from the model's without LoRA by up to "
            f"{float((a.float() - b.float()).abs().max()):.3g}"
        )


@pytest.mark.self_consistency("the LoRA-served model against the same target's model without LoRA")
@pytest.mark.parametrize("form", ["mixed", "videos-t2"])
def test_a_request_embeds_as_without_lora_under_an_adapter(target, form):
    """The towers and a video's marker tokens run without LoRA: a request through the
    LoRA-served model's request path, with an embedding adapter active for a short prompt,
    embeds every item exactly as the model without LoRA does."""
    spec = FORMS_BY_NAME[form].spec
    served = target.lora(spec, LoRAOptions())
    served.add(1, adapter_folder(spec, ADAPTERS_BY_NAME["lm-embeddings-vllm-names"]))
    expected = target.model(spec, CPU).run_request(FORMS_BY_NAME[form].request)
    got = served.run_request(FORMS_BY_NAME[form].request, [1] * 4)
    assert got.items == expected.items, "placeholders differ from the model's without LoRA"
    for item, a, b in zip(got.items, got.embeddings, expected.embeddings, strict=True):
        name = f"{item.modality}[{item.index}]"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)}, without LoRA {tuple(b.shape)}"
        assert torch.equal(a, b), (
            f"{name}: rows differ from the model's without LoRA by up to "
            f"{float((a.float() - b.float()).abs().max()):.3g}"
        )


#: The modules whose outputs the loading and slot checks read: one every adapter here names,
#: one the attention-only adapter does not.
PROBES = (
    "language_model.backbone.layers.2.mixer.q_proj",
    "language_model.backbone.layers.1.mixer.up_proj",
)
#: The adapters the slot checks cycle through (one names only some of the modules).
SLOT_ADAPTERS = ("lm-projections", "rank-4", "attention-only")


@pytest.mark.parametrize("kind", sorted(BROKEN_ADAPTERS))
def test_a_broken_adapter_is_refused_clearly(target, kind, tmp_path):
    options = LoRAOptions()
    served = target.lora(SPEC, options)
    good = ADAPTERS_BY_NAME["lm-projections"]
    served.add(1, adapter_folder(SPEC, good))
    folder = write_broken_adapter(SPEC, kind, tmp_path / f"adapter-{kind}", options.max_lora_rank)
    try:
        served.add(2, folder)
    except Exception as e:
        assert_clear_error(e, [BROKEN_ADAPTERS[kind]])
        assert folder.name in str(e), f"the error does not name the adapter's folder: {e}"
    else:
        raise AssertionError(f"{kind}: the adapter in {folder.name} was loaded, without an error")
    assert served.adapters() == [1], f"adapters loaded after the refusal: {served.adapters()}"
    # The refused adapter's slot is the next one filled: it must hold nothing of it.
    subset = ADAPTERS_BY_NAME["attention-only"]
    served.add(3, adapter_folder(SPEC, subset))
    for module in PROBES:
        problem = serves_its_adapters(served, module, [1, 0, 3, 1, 3], {1: good, 3: subset})
        assert problem is None, f"after refusing {kind}: {problem}"


#: Operations on a two-slot server: add adapter k, serve a batch of some loaded adapters, remove.
OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["add", "serve", "remove"]), st.integers(1, 3)),
    min_size=1,
    max_size=8,
)


@pytest.fixture(scope="module")
def two_slot_serving(target) -> LoRAServing:
    return target.lora(SPEC, LoRAOptions(max_loras=2))


@settings(max_examples=15)
@given(operations=OPERATIONS)
def test_slots_never_serve_another_adapters_weights(two_slot_serving, operations):
    """Three adapters through two slots in any order of adds, batches and removals: every
    token gets its own adapter's delta, and nothing on a module its adapter does not name (a
    slot never keeps an earlier adapter's weights)."""
    served = two_slot_serving
    adapters = {i + 1: ADAPTERS_BY_NAME[name] for i, name in enumerate(SLOT_ADAPTERS)}
    for adapter_id in served.adapters():
        served.remove(adapter_id)
    for operation, adapter_id in operations:
        loaded = served.adapters()
        if operation == "add" and adapter_id not in loaded:
            served.add(adapter_id, adapter_folder(SPEC, adapters[adapter_id]))
        elif operation == "remove" and adapter_id in loaded:
            served.remove(adapter_id)
        elif operation == "serve" and loaded:
            batch = sorted(loaded)[-2:]  # at most as many adapters as slots
            ids = [batch[0], 0, batch[-1], batch[0]]
            for module in PROBES:
                problem = serves_its_adapters(served, module, ids, adapters)
                assert problem is None, f"after {operations}: {problem}"
