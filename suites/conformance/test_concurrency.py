"""Metadata and prompt expansion under concurrency (vLLM PR #38655), on every target.

Metadata questions (video / audio support, the dynamic tiler) are answered from the config with
the processor factory refusing to run, and stay right when configs are made and freed in a loop
(a cache keyed by ``id()`` would serve a freed config's answers to its successor); 32 threads
share one real fast tokenizer across 2,000+ metadata and prompt-expansion calls, and 32 threads
send real requests through one shared processor (the engine's renderer shares one across its
thread pool), with no error and results equal to the single-threaded ones (with ``tokenizers``
0.23 a shared-state race shows as wrong results, not ``Already borrowed``, so every result is
compared)."""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable

import pytest

from harness.checkpoint import ModelSpec
from harness.requests import FORMS_BY_NAME
from reference_impl.tokenizer import build_tokenizer

pytestmark = pytest.mark.concern("metadata")

THREADS = 32
CALLS_PER_THREAD = 64  # 2,048 calls


def answers(metadata):
    return [metadata.supports_video(), metadata.supports_audio(), metadata.is_dynamic_tiler()]


def test_metadata_is_answered_without_a_processor(target):
    assert answers(target.metadata(ModelSpec(), build_tokenizer())) == [True, True, False]


def test_dynamic_and_audio_free_configs(target):
    spec = ModelSpec(dynamic_resolution=True, audio=False)
    assert answers(target.metadata(spec, build_tokenizer())) == [True, False, True]


def test_configs_made_and_freed_in_a_loop(target):
    """Alternating checkpoints, each config freed before the next is made: every answer is its
    own config's."""
    specs = [ModelSpec(), ModelSpec(dynamic_resolution=True, audio=False)]
    expected = [[True, True, False], [True, False, True]]
    tokenizer = build_tokenizer()
    for i in range(8):
        metadata = target.metadata(specs[i % 2], tokenizer, fresh=True)
        assert answers(metadata) == expected[i % 2], f"round {i}: a stale answer"
        del metadata
        gc.collect()


def run_in_threads(work: list[Callable[[], object]], calls_per_thread: int) -> int:
    """Run ``work`` round-robin in :data:`THREADS` threads started together; every result must
    equal the single-threaded one. Returns the number of calls made."""
    expected = [call() for call in work]
    errors: list[str] = []
    wrong: list[int] = []
    done = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def worker(offset: int) -> None:
        barrier.wait()
        for i in range(calls_per_thread):
            k = (offset + i) % len(work)
            try:
                result = work[k]()
            except Exception as e:  # every failure is collected and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            with lock:
                done[0] += 1
                if result != expected[k]:
                    wrong.append(k)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    assert wrong == [], f"{len(wrong)} results differ from the single-threaded ones"
    return done[0]


@pytest.mark.concern("requests")
def test_requests_through_one_processor_under_32_threads(request_runs):
    model = request_runs.model("mixed")
    forms = ("images-pil", "audios", "video-t1", "mixed")  # one checkpoint: one processor
    work = [functools.partial(model.process_request, FORMS_BY_NAME[f].request) for f in forms]
    assert run_in_threads(work, calls_per_thread=2) == THREADS * 2


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
    assert run_in_threads(work, CALLS_PER_THREAD) == THREADS * CALLS_PER_THREAD >= 2000
