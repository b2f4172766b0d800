"""The processor under concurrency (vLLM PR #38655): metadata answered from the config, prompt
expansion sharing one fast tokenizer across threads, results equal to the single-threaded ones.

A deliberately wrong variant (a metadata path that builds a processor and reconfigures the
shared tokenizer, as the pre-fix code did) must fail the same check: with ``tokenizers`` 0.23
the shared-state race shows as wrong (truncated) results rather than ``Already borrowed``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.targets.reference.mutant import REFERENCE_MUTANTS
from harness.targets.reference.target import ConfigMetadata
from reference_impl import presets, processor
from reference_impl.metadata import is_dynamic_tiler, supports_audio, supports_video
from reference_impl.tokenizer import VOCAB_SIZE, build_tokenizer
from reference_impl.video_replacement import video_replacement_ids
from suites.stress import THREADS, ThreadedRun, run_in_threads

CONFIG = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)
CALLS_PER_THREAD = 70  # 32 x 70 = 2,240 calls
LONG_TEXT = "Describe the video in detail, frame by frame, " * 12


def calls(tokenizer, metadata: Callable[[], tuple[bool, bool, bool]]):
    """The mixed workload: metadata questions, prompt expansion, separator tokenisation."""
    proc = processor.NanoNemotronVLProcessor(CONFIG, tokenizer)
    return [
        lambda: metadata(),
        lambda: tuple(proc(LONG_TEXT).input_ids),
        lambda: tuple(video_replacement_ids(tokenizer, [4, 4], [0, 2, 4], 500, 2)),
        lambda: tuple(tokenizer.encode(LONG_TEXT, add_special_tokens=False)),
    ]


def config_only_metadata() -> tuple[bool, bool, bool]:
    return (
        supports_video(CONFIG),
        supports_audio(CONFIG),
        is_dynamic_tiler(CONFIG),
    )


def stress(tokenizer, metadata: Callable[[], tuple[bool, bool, bool]]) -> ThreadedRun:
    """Run the workload on 32 threads against single-threaded expectations."""
    return run_in_threads(calls(tokenizer, metadata), CALLS_PER_THREAD)


def test_shared_tokenizer_under_32_threads():
    run = stress(build_tokenizer(), config_only_metadata)
    assert run.errors == []
    assert run.wrong == 0
    assert run.calls == THREADS * CALLS_PER_THREAD >= 2000


def test_metadata_never_builds_a_processor(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a metadata path built the processor")

    monkeypatch.setattr(processor.NanoNemotronVLProcessor, "__init__", refuse)
    assert config_only_metadata() == (True, True, True)


def test_the_pre_fix_metadata_path_fails_the_same_check(monkeypatch):
    """Mutant ``processor-in-metadata``: ``supports_video`` builds a processor, which reconfigures
    the shared tokenizer (truncation on). Concurrent encodes then see the truncation: the check
    fails."""
    tokenizer = build_tokenizer()
    REFERENCE_MUTANTS["processor-in-metadata"](monkeypatch.setattr)
    metadata = ConfigMetadata(CONFIG, tokenizer)

    def building_metadata() -> tuple[bool, bool, bool]:
        return metadata.supports_video(), metadata.supports_audio(), metadata.is_dynamic_tiler()

    failures = 0
    for _ in range(3):  # a race: give it a few chances, it needs only one
        run = stress(tokenizer, building_metadata)
        failures += len(run.errors) + run.wrong
        if failures:
            break
    if failures == 0:
        pytest.fail("the pre-fix metadata path did not disturb the shared tokenizer")
