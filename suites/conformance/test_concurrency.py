"""Metadata and prompt expansion under concurrency (vLLM PR #38655), on every target.

Metadata questions are answered without constructing the processor (test_metadata.py checks
every entry point) and stay right when configs are made and freed in a loop (a cache keyed by
``id()`` would serve a freed config's answers to its successor); 32 threads share one real fast
tokenizer across 2,000+ metadata and prompt-expansion calls without constructing a processor,
with no error and results equal to the single-threaded ones (with ``tokenizers`` 0.23 a
shared-state race shows as wrong results, not ``Already borrowed``, so every result is compared).
Real requests through one shared processor under 32 threads: test_requests.py."""

from __future__ import annotations

import functools
import gc

import pytest

from harness.checkpoints.spec import ModelSpec
from reference_impl.tokenizer import build_tokenizer
from suites.stress import THREADS, run_in_threads

pytestmark = pytest.mark.concern("metadata")

CALLS_PER_THREAD = 64  # 2,048 calls


def answers(metadata):
    return [metadata.supports_video(), metadata.supports_audio(), metadata.is_dynamic_tiler()]


def test_configs_made_and_freed_in_a_loop(target):
    """Alternating checkpoints, each config freed before the next is made: every answer is its
    own config's."""
    specs = [ModelSpec(), ModelSpec(dynamic_resolution=True, audio=False)]
    expected = [[True, True, False], [True, False, True]]
    tokenizer = build_tokenizer()
    for i in range(4):
        metadata = target.metadata(specs[i % 2], tokenizer, fresh=True)
        assert answers(metadata) == expected[i % 2], f"round {i}: a stale answer"
        del metadata
        gc.collect()


@pytest.mark.self_consistency("results under 32 threads against the same calls made one at a time")
def test_shared_tokenizer_under_32_threads(target):
    tokenizer = build_tokenizer()
    metadata = target.metadata(ModelSpec(), tokenizer)
    replacement = functools.partial(target.video_replacement, tokenizer)
    work = [
        metadata.supports_video,
        metadata.supports_audio,
        metadata.is_dynamic_tiler,
        functools.partial(replacement, [4, 4, 4], [0, 1, 2], 500, 1),
        functools.partial(replacement, [4, 4], [0, 2, 4], 250, 2),
        functools.partial(replacement, [4, 4], [0, 1], None, 1),
    ]
    run = run_in_threads(work, CALLS_PER_THREAD)
    # Every symptom at once: the race's own (errors, wrong or truncated results) and its cause
    # (a processor built by a metadata call, reconfiguring the shared tokenizer).
    problems = run.problems()
    if metadata.constructions:
        problems.append(
            f"the metadata calls constructed the processor {metadata.constructions} times"
        )
    assert problems == [], "; ".join(problems)
    assert run.calls == THREADS * CALLS_PER_THREAD >= 2000
