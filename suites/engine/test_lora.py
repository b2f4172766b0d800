"""LoRA as the engine serves it: several adapter folders (PEFT, written by
:mod:`harness.checkpoints.lora_adapters`) named per request and interleaved in one batch, more
adapters than slots, each request's answer against the fp32 reference with the same adapter on
its language model; adapters that also target the towers, served on the language model only
(LM-only LoRA, #56231); and the base model's answers unchanged while adapters are loaded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.checkpoints.lora_adapters import ADAPTERS_BY_NAME, adapter_folder
from harness.oracles.decoding import compare_answers, greedy_agreement
from harness.oracles.engine_bounds import engine_bound, engine_tie_bound
from harness.problems import assert_no_problems
from harness.targets.engine import (
    ENGINE_SPEC,
    Adapter,
    EngineOptions,
    EngineOutput,
    Sampling,
    engine_prompt,
)
from suites.engine.conftest import DECODED, SAMPLING, Measure, Served, form_request

pytestmark = pytest.mark.concern("engine")

#: Two slots, four adapters kept on the CPU: a batch naming four swaps them.
LORA = EngineOptions(enable_lora=True, max_loras=2, max_cpu_loras=4, max_lora_rank=8)
#: Decoded tokens' log-probabilities only: see the prompt log-probability checks below.
DECODED_ONLY = Sampling(max_tokens=DECODED, logprobs=2, prompt_logprobs=None)
#: The batch: (request form, adapter or None for the base model, the form's log-probability
#: path); a video request with an adapter reaches the video's marker tokens (#56231).
BATCH = (
    ("text", "lm-projections", "text"),
    ("text", None, "text"),
    ("text", "rank-4", "text"),
    ("images-pil", "attention-only", "image-static"),
    ("text", "rslora", "text"),
    ("video-t1", "lm-projections", "video-t1"),
)
ADAPTER_IDS = {"lm-projections": 1, "rank-4": 2, "attention-only": 3, "rslora": 4}
TOWER_ADAPTER_IDS = {"with-towers": 10, "towers-only": 11}


def lm_only(folder: Path) -> Path:
    """A copy of the adapter in ``folder`` with its language-model modules only: what vLLM
    serves of an adapter that also targets the towers, and the reference's to apply."""
    from safetensors.torch import load_file, save_file

    copy = folder.with_name(folder.name + "-lm-only")
    if not copy.exists():
        copy.mkdir()
        (copy / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
        tensors = load_file(folder / "adapter_model.safetensors")
        lm = "base_model.model.language_model."
        save_file(
            {k: v for k, v in tensors.items() if k.startswith(lm)},
            copy / "adapter_model.safetensors",
        )
    return copy


def served_adapter(name: str) -> Adapter:
    adapter_id = {**ADAPTER_IDS, **TOWER_ADAPTER_IDS}[name]
    return Adapter(name, adapter_id, adapter_folder(ENGINE_SPEC, ADAPTERS_BY_NAME[name]))


def against_the_reference(
    served: Served, form: str, path: str, adapter: Adapter | None, answer: EngineOutput
) -> list[str]:
    """The answer's greedy tokens, their log-probabilities and (where it has them) its prompt's
    against the reference's with the adapter's language-model modules applied."""
    _, request = form_request(form)
    folder = None if adapter is None else lm_only(adapter.folder)
    reference = served.oracle(form).scores(request, answer.tokens, adapter=folder)
    bound = engine_bound(f"reference | {path}").value
    if answer.prompt_token_ids != reference.prompt_token_ids:
        return ["the prompt token ids differ from the reference processor's"]
    problems = []
    if any(p is not None for p in answer.prompt_logprobs):
        prompt = [
            abs(a - e)
            for a, e in zip(answer.prompt_logprobs, reference.prompt_logprobs, strict=True)
            if a is not None and e is not None
        ]
        if max(prompt) > bound:
            problems.append(
                f"prompt log-probabilities up to {max(prompt):.4g} nats off (bound {bound:.4g})"
            )
        # The largest difference alone is bounded loosely (one position's bf16 error); the
        # prompt's root mean square is what an adapter applied at the wrong scale moves.
        rms = math.sqrt(sum(e * e for e in prompt) / len(prompt))
        rms_bound = engine_bound(f"reference-rms | {path}").value
        if rms > rms_bound:
            problems.append(
                f"prompt log-probabilities {rms:.4g} nats off in root mean square (bound "
                f"{rms_bound:.4g})"
            )
    tie = engine_tie_bound((path,))
    agreement = greedy_agreement(answer.tokens, reference.greedy, reference.margins, tie)
    if agreement.problem:
        problems.append(agreement.problem)
    decoded = agreement.largest_difference(answer.token_logprobs, reference.continuation_logprobs)
    if decoded > bound:
        problems.append(
            f"decoded log-probabilities up to {decoded:.4g} nats off (bound {bound:.4g})"
        )
    return problems


def test_adapters_interleaved_in_one_batch_match_the_reference(
    served: Served, measure: Measure
) -> None:
    engine = served.target.engine(ENGINE_SPEC, LORA)
    names = sorted({name for _, name, _ in BATCH if name is not None})
    assert len(names) > LORA.max_loras, "the batch must name more adapters than there are slots"
    adapters = [served_adapter(name) if name else None for _, name, _ in BATCH]
    prompts = [engine_prompt(form_request(form)[1]) for form, _, _ in BATCH]
    answers = engine.generate(prompts, DECODED_ONLY, adapters)
    problems = []
    for (form, name, path), adapter, answer in zip(BATCH, adapters, answers, strict=True):
        problems += [
            f"{form} with {name or 'no adapter'}: {p}"
            for p in against_the_reference(served, form, path, adapter, answer)
        ]
    base = answers[1]
    changed = [
        n
        for (_, n, _), a in zip(BATCH, answers, strict=True)
        if n and a.token_logprobs != base.token_logprobs
    ]
    measure("adapters", {"adapters": len(names), "slots": LORA.max_loras, "changed": len(changed)})
    assert_no_problems(problems)
    assert changed, "no adapter changed an answer: the check cannot see an adapter dropped"


@pytest.mark.self_consistency("each request of the interleaved batch against the same alone")
def test_each_request_of_the_interleaved_batch_answers_as_alone(
    served: Served, measure: Measure
) -> None:
    """Each request's adapter, or none, is its own inside a batch that names others: its answer
    against the same request served alone by the same engine, within the batched-vs-alone
    bound (the reference's bound is wide enough for another adapter's delta to stay under)."""
    engine = served.target.engine(ENGINE_SPEC, LORA)
    adapters = [served_adapter(name) if name else None for _, name, _ in BATCH]
    prompts = [engine_prompt(form_request(form)[1]) for form, _, _ in BATCH]
    batched = engine.generate(prompts, DECODED_ONLY, adapters)
    bound = engine_bound("batched-vs-alone").value
    largest, problems = 0.0, []
    for (form, name, _), adapter, prompt, answer in zip(
        BATCH, adapters, prompts, batched, strict=True
    ):
        alone = engine.generate([prompt], DECODED_ONLY, [adapter])[0]
        difference, found = compare_answers(alone, answer, bound)
        largest = max(largest, difference)
        problems += [f"{form} with {name or 'no adapter'}: {p}" for p in found]
    measure("interleaved batch", {"largest_logprob_difference": largest, "bound": bound})
    assert_no_problems(problems, "inside the interleaved batch: ")


@pytest.mark.parametrize(("form", "name", "path"), [b for b in BATCH if b[1]], ids=lambda v: str(v))
def test_prompt_logprobs_with_an_adapter_match_the_reference(
    served: Served, form: str, name: str, path: str
) -> None:
    engine = served.target.engine(ENGINE_SPEC, LORA)
    adapter = served_adapter(name)
    answer = engine.generate([engine_prompt(form_request(form)[1])], SAMPLING, [adapter])[0]
    problems = against_the_reference(served, form, path, adapter, answer)
    assert_no_problems(problems, f"{form} with {name}: ")


@pytest.mark.parametrize("name", list(TOWER_ADAPTER_IDS))
def test_adapters_targeting_the_towers_are_served_on_the_language_model(
    served: Served, name: str
) -> None:
    engine = served.target.engine(ENGINE_SPEC, LORA)
    adapter = served_adapter(name)
    answer = engine.generate(
        [engine_prompt(form_request("images-pil")[1])], DECODED_ONLY, [adapter]
    )[0]
    problems = against_the_reference(served, "images-pil", "image-static", adapter, answer)
    assert_no_problems(problems, f"{name}: ")


@pytest.mark.self_consistency("the base model in the LoRA engine against the engine without LoRA")
def test_the_base_model_is_unchanged_while_adapters_are_loaded(
    served: Served, measure: Measure
) -> None:
    engine = served.target.engine(ENGINE_SPEC, LORA)
    loaded = [served_adapter("lm-projections"), served_adapter("rank-4")]
    _, text = form_request("text")
    engine.generate([engine_prompt(text)] * 2, DECODED_ONLY, loaded)
    for form in ("text", "mixed"):
        base = engine.generate([engine_prompt(form_request(form)[1])], SAMPLING, [None])[0]
        largest, problems = compare_answers(
            served.answer(form), base, engine_bound("batched-vs-alone").value
        )
        measure(f"{form}, base model", {"largest_logprob_difference": largest})
        assert_no_problems(problems, f"{form}, no adapter, adapters loaded: ")


def test_prompt_logprobs_of_two_adapter_requests_in_one_batch(served: Served) -> None:
    """Two requests with an adapter that ask for their prompts' log-probabilities, in one batch,
    as two users' completions with ``echo`` and ``logprobs`` reach one server. Last of the
    module: vLLM's CPU build dies of it (a known deviation), and a dead engine is built again."""
    engine = served.target.engine(ENGINE_SPEC, LORA)
    adapter = served_adapter("lm-projections")
    _, text = form_request("text")
    answers = engine.generate([engine_prompt(text)] * 2, SAMPLING, [adapter, adapter])
    alone = engine.generate([engine_prompt(text)], SAMPLING, [adapter])[0]
    for answer in answers:
        _, problems = compare_answers(alone, answer, engine_bound("batched-vs-alone").value)
        assert_no_problems(problems)
