"""Metadata and prompt expansion under concurrency (vLLM PR #38655), on every target.

Metadata questions (video / audio support, the dynamic tiler) are answered from the config with
the processor factory refusing to run; 32 threads share one real fast tokenizer across 2,000+
metadata and prompt-expansion calls, with no error and results equal to the single-threaded
ones (with ``tokenizers`` 0.23 a shared-state race shows as wrong results, not ``Already
borrowed``, so every result is compared)."""

from __future__ import annotations

import threading

from reference_impl.tokenizer import build_tokenizer

THREADS = 32
CALLS_PER_THREAD = 64  # 2,048 calls


def test_metadata_is_answered_without_a_processor(make_shell, target):
    spec = make_shell().spec
    answers = [call() for call in target.metadata_calls(spec, build_tokenizer())]
    assert answers == [True, spec.audio, spec.dynamic_resolution]


def test_dynamic_and_audio_free_configs(make_shell, target):
    spec = make_shell(dynamic_resolution=True, audio=False).spec
    answers = [call() for call in target.metadata_calls(spec, build_tokenizer())]
    assert answers == [True, False, True]


def test_shared_tokenizer_under_32_threads(make_shell, target):
    spec = make_shell().spec
    tokenizer = build_tokenizer()
    work = target.metadata_calls(spec, tokenizer) + target.expansion_calls(spec, tokenizer)
    expected = [call() for call in work]
    errors: list[str] = []
    wrong: list[int] = []
    done = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def worker(offset: int) -> None:
        barrier.wait()
        for i in range(CALLS_PER_THREAD):
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
    assert done[0] == THREADS * CALLS_PER_THREAD >= 2000
