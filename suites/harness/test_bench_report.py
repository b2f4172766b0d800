"""The benchmark report computes each speed goal from best-of-rounds times, flags a missed one."""

from __future__ import annotations

from harness.jobs.bench_report import SPEED_GOALS, main, render

NAMES = {
    "test_prefill[M*M--reference-1024]": 0.050,
    "test_prefill[M*M--transformers-1024]": 0.050,
    "test_prefill[M*M--reference-4096]": 0.200,
    "test_prefill[M*M--transformers-4096]": 0.250,
    "test_decode_after_256[M*M--reference]": 0.030,
    "test_decode_after_256[M*M--transformers]": 0.060,
    "test_prefill_all_mamba[1024]": 0.100,
    "test_prefill_all_mamba[4096]": 0.400,
    "test_decode_all_mamba[256]": 0.050,
    "test_decode_all_mamba[4096]": 0.055,
    "test_scan_2048[sequential]": 0.120,
    "test_scan_2048[chunked]": 0.020,
    "test_end_to_end_tiny_omni": 2.5,
    "test_shrunk_preset_build_and_forward[nemotron_nano_12b_v2_vl]": 0.5,
    "test_shrunk_preset_build_and_forward[nemotron_3_nano_omni]": 0.8,
}


def data(**changes):
    times = NAMES | changes
    return {"benchmarks": [{"name": n, "stats": {"median": v, "min": v}} for n, v in times.items()]}


def test_all_speed_goals_met():
    text, ok = render(data())
    assert ok
    assert text.count("| yes |") == len(SPEED_GOALS)
    assert "| scan at L=2048: sequential / chunked | >= 5 | 6.000 | yes |" in text


def test_a_missed_speed_goal_is_reported_and_fails():
    text, ok = render(data(**{"test_prefill[M*M--reference-1024]": 0.060}))
    assert not ok
    assert "| prefill 1,024 tokens: reference / transformers | <= 1.05 | 1.200 | **no** |" in text


def test_a_missing_case_is_not_met(tmp_path):
    payload = data()
    payload["benchmarks"] = payload["benchmarks"][1:]
    path = tmp_path / "b.json"
    import json

    path.write_text(json.dumps(payload))
    assert main([str(path), str(tmp_path / "b.md")]) == 1
    assert "not measured" in (tmp_path / "b.md").read_text()
