"""The load run's arithmetic and verdict (``harness.jobs.load``), on hand-written outcomes; the
run itself is ``nox -s bench``'s."""

from __future__ import annotations

import pytest

from harness.jobs.load import LoadReport, Outcome, main, percentiles, render


def test_percentiles_are_nearest_ranks() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentiles(values) == {"p50": 5.0, "p90": 9.0, "p99": 10.0, "max": 10.0}
    assert percentiles([0.25]) == {"p50": 0.25, "p90": 0.25, "p99": 0.25, "max": 0.25}
    assert percentiles([]) == {}


def test_a_failed_request_unsent_requests_or_memory_growth_fail_the_run() -> None:
    report = LoadReport(requests=4, concurrency=2, time_limit_s=10, memory_growth_limit_mib=100)
    report.outcomes = [
        Outcome("text", 0.0, 1.0, 200),
        Outcome("text", 0.1, 3.0, 200),
        Outcome("audios", 0.2, 0.5, 400, "bad"),
    ]
    report.not_sent, report.duration_s = 1, 4.0
    report.memory_after_warmup_mib, report.memory_at_end_mib = 1000.0, 1150.0
    summary = report.summary()
    assert summary["throughput_rps"] == 0.5  # two answered in 4 s
    assert summary["errors"] == {"HTTP 400": 1}
    assert summary["latency_s"]["max"] == 3.0
    assert summary["memory_growth_mib"] == 150.0
    assert summary["problems"] == [
        "1 requests got HTTP 400",
        "1 requests not sent within 10 s",
        "the server's memory grew by 150 MiB, above 100",
    ]
    assert "grew 150.0 MiB (limit 100 MiB)" in render(summary, "vllm serve X")


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(SystemExit):
        main(["--requests", "0"])
    with pytest.raises(SystemExit):
        main(["--time-limit", "-1"])
