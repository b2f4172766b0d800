"""The reference's language model as the oracle of an engine: log-probabilities of every prompt
token, and of a continuation read token by token (teacher forcing), in fp32.

A served engine's answers are compared with these: its prompt log-probabilities position by
position, its greedy tokens against the reference's choice at each step (a divergence is a tie
only where the reference's own top-2 margin is inside the bound).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import Request
from reference_impl.lora import LoRAModel
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.processor import ProcessorOutput


@dataclass(frozen=True)
class Scores:
    """The reference on a prompt and a continuation: the processed prompt's ids; the
    log-probability of each prompt token after those before it (None for the first); of each
    continuation token; the reference's own greedy choice at each continuation step and its
    top-2 margin (nats) there."""

    prompt_token_ids: list[int]
    prompt_logprobs: list[float | None]
    continuation_logprobs: list[float]
    greedy: list[int]
    margins: list[float]
    #: The prompt positions of video placeholders: EVS's frame separators among them are text
    #: the reference writes and vLLM's prompt holds as placeholders (its model embeds them).
    video_positions: frozenset[int] = frozenset()

    def prompt_differences(self, engine_ids: Sequence[int]) -> tuple[list[int], str | None]:
        """The positions whose log-probabilities compare with an engine's prompt
        ``engine_ids`` (where both prompts hold the same token), and a problem where the
        prompts differ elsewhere than in video placeholders, or in length."""
        if len(engine_ids) != len(self.prompt_token_ids):
            return [], (
                f"the engine's prompt has {len(engine_ids)} tokens, the reference "
                f"processor's {len(self.prompt_token_ids)}"
            )
        pairs = zip(engine_ids, self.prompt_token_ids, strict=True)
        differ = [i for i, (a, b) in enumerate(pairs) if a != b]
        outside = [i for i in differ if i not in self.video_positions]
        if outside:
            return [], (
                f"the engine's prompt differs from the reference processor's at {len(outside)} "
                f"positions outside video placeholders, first at {outside[0]}"
            )
        return [i for i in range(1, len(engine_ids)) if i not in set(differ)], None


#: Adapters the oracle holds at once (each in a slot of its LoRA wrappers) and their largest rank.
ORACLE_LORA_SLOTS = 8
ORACLE_LORA_RANK = 16


class ReferenceLanguageModel:
    """The fp32 reference model of a checkpoint folder, served as ``spec`` says (its tile
    limit, EVS rate and context); a LoRA adapter (a PEFT folder) applied to its language model
    where a question names one, as vLLM serves LoRA on this model (LM only)."""

    def __init__(self, folder: Path, spec: ModelSpec, max_model_len: int) -> None:
        self.folder = folder
        self.spec = spec
        self.max_model_len = max_model_len
        self._lora: LoRAModel | None = None

    @functools.cached_property
    def model(self) -> NanoNemotronVLForConditionalGeneration:
        from reference_impl.checkpoint import load_folder
        from reference_impl.tokenizer import shared_tokenizer

        return load_folder(
            self.folder,
            shared_tokenizer(),
            max_num_tiles=self.spec.max_num_tiles,
            video_pruning_rate=self.spec.video_pruning_rate,
            max_model_len=self.max_model_len,
        )

    def process(self, request: Request) -> ProcessorOutput:
        """The request through the reference processor, as the engine's loaders hand it on."""
        from harness.checkpoints.serving import DEFAULT_SERVING
        from harness.targets.reference.requests import processed

        return processed(self.model.multimodal, request, DEFAULT_SERVING)

    def _adapter_slot(self, folder: Path) -> str:
        """The name ``folder``'s adapter is loaded under in the oracle's LoRA wrappers (the
        wrappers made, and the adapter read and loaded, on first use)."""
        from reference_impl.adapters import read_peft_adapter
        from reference_impl.lora import apply_lora

        if self._lora is None:
            lm = self.model.language_model
            self._lora = apply_lora(
                lm,
                max_loras=ORACLE_LORA_SLOTS,
                max_rank=ORACLE_LORA_RANK,
                max_num_batched_tokens=self.max_model_len + 1024,
            )
            # The wrapper model reads the LM's embedding layer through its own attribute.
            self.model.multimodal.embed_tokens = lm.model.embed_tokens
        name = str(folder)
        if name not in self._lora.adapters:
            self._lora.load(read_peft_adapter(folder, name))
        return name

    @torch.no_grad()
    def scores(
        self,
        prompt: Request | Sequence[int],
        continuation: Sequence[int] = (),
        adapter: Path | None = None,
    ) -> Scores:
        """The reference's log-probabilities of ``prompt`` (a request, or token ids) followed by
        ``continuation``, with the LoRA adapter in folder ``adapter`` applied where given."""
        if isinstance(prompt, Request):
            out = self.process(prompt)
            ids, mask, placeholders, mm_kwargs = (
                list(out.input_ids),
                list(out.is_multimodal),
                out.placeholders,
                out.mm_kwargs,
            )
        else:
            ids, mask, placeholders, mm_kwargs = list(prompt), [False] * len(prompt), [], {}
        full = ids + list(continuation)
        name = self._adapter_slot(adapter) if adapter is not None else None
        if self._lora is not None:
            has_video = any(p.modality == "videos" for p in placeholders)
            self._lora.prepare([(name, len(full), has_video)])
        logits = self.model.forward(
            torch.tensor(full),
            torch.tensor(mask + [False] * len(continuation)),
            placeholders,
            **mm_kwargs,
        )
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(full[1:])
        chosen = logprobs[:-1].gather(1, target[:, None])[:, 0].tolist()
        n = len(ids)
        steps = logprobs[n - 1 : n - 1 + len(continuation)] if continuation else logprobs[n - 1 :]
        top2 = steps.topk(2, dim=-1)
        video = frozenset(
            i
            for p in placeholders
            if p.modality == "videos"
            for i in range(p.start, p.start + p.length)
        )
        return Scores(
            ids,
            [None, *chosen[: n - 1]],
            chosen[n - 1 :],
            top2.indices[:, 0].tolist(),
            (top2.values[:, 0] - top2.values[:, 1]).tolist(),
            video,
        )
