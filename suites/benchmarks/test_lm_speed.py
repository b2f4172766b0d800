"""Speed of the reference language model, side by side with transformers' NemotronH.

Run with ``nox -s bench`` (writes ``reports/benchmarks/``); not part of the test run. Each case is
a pytest-benchmark measurement; the targets (ratios between cases) are computed by
``harness.jobs.bench_report`` from the saved JSON, never asserted on timings here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.oracles.transformers_models import reference_from, transformers_nemotron_h
from reference_impl import presets
from reference_impl.ssd import ssd_chunked, ssd_sequential

pytestmark = pytest.mark.bench

ROUNDS = 5
DECODE_STEPS = 32


@pytest.fixture(scope="module", params=["M*M-"])
def models(request):
    torch.set_num_threads(2)
    config = presets.bench_text_config(request.param)
    hf = transformers_nemotron_h(config, seed=0, scale=0.05)
    return config, hf, reference_from(hf, config)


def tokens(config, length):
    return torch.randint(
        0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize("length", [1024, 4096])
@pytest.mark.parametrize("impl", ["reference", "transformers"])
def test_prefill(benchmark, models, impl, length):
    config, hf, ours = models
    ids = tokens(config, length)
    benchmark.group = f"prefill M*M- L={length}"
    benchmark.extra_info.update(kind="prefill", impl=impl, length=length, pattern="M*M-")
    with torch.no_grad():
        if impl == "reference":
            benchmark.pedantic(lambda: ours(ids), rounds=ROUNDS, warmup_rounds=1)
        else:
            benchmark.pedantic(lambda: hf(ids, use_cache=False), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("impl", ["reference", "transformers"])
def test_decode_after_256(benchmark, models, impl):
    """Time to decode DECODE_STEPS tokens one by one after a 256-token prompt (untimed)."""
    config, hf, ours = models
    ids = tokens(config, 256)
    step = torch.tensor([[7]])
    benchmark.group = "decode M*M- after 256"
    benchmark.extra_info.update(kind="decode", impl=impl, context=256, steps=DECODE_STEPS)

    with torch.no_grad():
        if impl == "reference":

            def setup():
                cache = ours.new_cache(1, 256 + DECODE_STEPS)
                ours(ids, cache=cache)
                return (cache,), {}

            def run(cache):
                for _ in range(DECODE_STEPS):
                    ours(step, cache=cache)
        else:

            def setup():
                out = hf(ids, use_cache=True)
                return (out.past_key_values,), {}

            def run(cache):
                for _ in range(DECODE_STEPS):
                    hf(step, past_key_values=cache, use_cache=True)

        benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("length", [1024, 4096])
def test_prefill_all_mamba(benchmark, length):
    torch.set_num_threads(2)
    config = presets.bench_text_config("MMMM")
    ours = reference_from(transformers_nemotron_h(config, seed=0, scale=0.05), config)
    ids = tokens(config, length)
    benchmark.group = "prefill scaling, all-Mamba"
    benchmark.extra_info.update(kind="prefill-mamba", length=length)
    with torch.no_grad():
        benchmark.pedantic(lambda: ours(ids), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("context", [256, 4096])
def test_decode_all_mamba(benchmark, context):
    torch.set_num_threads(2)
    config = presets.bench_text_config("MMMM")
    ours = reference_from(transformers_nemotron_h(config, seed=0, scale=0.05), config)
    ids = tokens(config, context)
    step = torch.tensor([[7]])
    benchmark.group = "decode scaling, all-Mamba"
    benchmark.extra_info.update(kind="decode-mamba", context=context, steps=DECODE_STEPS)

    def setup():
        cache = ours.new_cache(1, context + DECODE_STEPS)
        with torch.no_grad():
            ours(ids, cache=cache)
        return (cache,), {}

    def run(cache):
        with torch.no_grad():
            for _ in range(DECODE_STEPS):
                ours(step, cache=cache)

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("form", ["sequential", "chunked"])
def test_scan_2048(benchmark, form):
    """The bare scan at L=2048 (8 heads x 64 channels, 2 groups, N=64, chunk 128)."""
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    length, h, p, n = 2048, 8, 64, 64
    args = (
        torch.randn(1, length, h, p, generator=g),
        F.softplus(torch.randn(1, length, h, generator=g)),
        -torch.rand(h, generator=g),
        torch.randn(1, length, 2, n, generator=g),
        torch.randn(1, length, 2, n, generator=g),
        torch.randn(h, generator=g),
    )
    benchmark.group = "scan L=2048"
    benchmark.extra_info.update(kind="scan", form=form)
    if form == "sequential":
        benchmark.pedantic(lambda: ssd_sequential(*args), rounds=ROUNDS, warmup_rounds=1)
    else:
        benchmark.pedantic(
            lambda: ssd_chunked(*args, chunk_size=128), rounds=ROUNDS, warmup_rounds=1
        )
