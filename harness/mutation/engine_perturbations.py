"""What the engine checks' bounds still catch: perturbations of known size in the Mamba mixer
the engine runs, each served through the ``vllm-engine-file:`` overlay, and the checks each
comparison's bound judges run against it.

    nemotron-vl-engine-perturbations [--sizes 0.3,0.1,0.03,0.01] [--out PATH]

Run in the engine environment (``.nox/engine/bin/``). Two perturbations, each
a relative change ``EPS`` of the SSM state in one place of vLLM's
``vllm/model_executor/layers/mamba/mamba_mixer2.py``:

- ``decode-state``: the state carried into every decode step is scaled by ``1 + EPS`` (a
  decode-only bug: prefill is untouched, so only checks that decode see it);
- ``chunk-handover``: the state a prefill chunk hands to the next (a split prefill, a prefix
  read from the cache, a preempted request recomputed) is scaled by ``1 + EPS``.

For each size, the checks of :data:`CHECKS` run on the perturbed file; the result is, per
perturbation and check (and so per comparison), the smallest size that failed it. A check that
passes at every size is a bound that does not see that perturbation at those sizes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from harness import ROOT
from harness.model_files import write_mutated_copy

MIXER = Path("vllm/model_executor/layers/mamba/mamba_mixer2.py")

_DECODE_CALL = """                selective_state_update(
                    ssm_state,
                    hidden_states_d,"""
_HANDOVER = """                    ssm_state[state_indices_tensor_p],
                    0,"""


def _decode_state(eps: float) -> Callable[[str], str]:
    def mutate(source: str) -> str:
        scaled = (
            f"                ssm_state[state_indices_tensor_d] = "
            f"ssm_state[state_indices_tensor_d] * {1 + eps!r}\n"
        )
        return _replace_once(source, _DECODE_CALL, scaled + _DECODE_CALL)

    return mutate


def _chunk_handover(eps: float) -> Callable[[str], str]:
    def mutate(source: str) -> str:
        return _replace_once(
            source,
            _HANDOVER,
            _HANDOVER.replace(
                "[state_indices_tensor_p]", f"[state_indices_tensor_p] * {1 + eps!r}"
            ),
        )

    return mutate


def _replace_once(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise SystemExit(
            f"engine perturbations: {MIXER}: expected the text to perturb once, found it "
            f"{source.count(old)} times (another vLLM release?): {old.strip()[:60]!r}"
        )
    return source.replace(old, new)


PERTURBATIONS: dict[str, Callable[[float], Callable[[str], str]]] = {
    "decode-state": _decode_state,
    "chunk-handover": _chunk_handover,
}
#: The checks run against each perturbation, with the comparison whose bound judges them.
CHECKS: dict[str, str] = {
    "suites/engine/test_decoding.py::"
    "test_decoded_logprobs_equal_the_sequence_sent_as_a_prompt": "decode-vs-prefill",
    "suites/engine/test_forward.py::"
    "test_greedy_decoding_matches_the_reference[text]": "reference | text",
    "suites/engine/test_batching.py::"
    "test_requests_preempted_for_a_small_kv_cache_answer_as_alone": (
        "chunked-vs-whole | each request's paths"
    ),
    "suites/engine/test_caching.py::test_chunked_prefill_equals_unchunked_serving[mixed]": (
        "chunked-vs-whole | image-static, video-t1, audio-hop-160"
    ),
    "suites/engine/test_caching.py::"
    "test_chunked_prefill_equals_unchunked_serving[video-t1]": "chunked-vs-whole | video-t1",
    "suites/engine/test_caching.py::"
    "test_a_repeated_request_is_read_from_the_prefix_cache_and_answers_the_same": (
        "chunked-vs-whole | image-static, video-t1, audio-hop-160"
    ),
}


def failed_checks(junit: Path) -> dict[str, str]:
    """The checks that failed in the JUnit file ``junit``, each with its message's first line."""
    failed = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            failed[name] = (problem.get("message") or "").splitlines()[0][:300]
    return failed


def run_checks(folder: Path, label: str, work: Path) -> dict[str, str]:
    """:data:`CHECKS` on the files under ``folder``; the failed ones by check id."""
    junit = work / f"{label}.xml"
    files = ",".join(str(p) for p in sorted(folder.rglob("*.py")))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *CHECKS,
            f"--target=vllm-engine-file:{files}" if files else "--target=vllm-engine",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={junit}",
        ],
        cwd=ROOT,
        check=False,
    )
    by_name = failed_checks(junit)
    found = {}
    for check in CHECKS:
        module, _, name = check.partition("::")
        classname = module.removesuffix(".py").replace("/", ".")
        if f"{classname}::{name}" in by_name:
            found[check] = by_name[f"{classname}::{name}"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.3,0.1,0.03,0.01", help="relative sizes EPS")
    parser.add_argument("--only", choices=sorted(PERTURBATIONS), help="one perturbation")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "engine_perturbations.json")
    args = parser.parse_args(argv)
    try:
        sizes = sorted((float(s) for s in args.sizes.split(",")), reverse=True)
    except ValueError:
        parser.error(f"--sizes: expected numbers separated by commas, got {args.sizes!r}")
    if not sizes or min(sizes) <= 0:
        parser.error(f"--sizes: expected sizes above 0, got {args.sizes!r}")
    names = [args.only] if args.only else list(PERTURBATIONS)
    results: dict[str, dict[str, dict[str, str]]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="perturb-") as tmp:
        work = Path(tmp)
        for name in names:
            results[name] = {}
            for eps in sizes:
                folder = work / f"{name}-{eps:g}"
                write_mutated_copy(MIXER, folder, PERTURBATIONS[name](eps))
                failed = run_checks(folder, f"{name}-{eps:g}", work)
                results[name][f"{eps:g}"] = failed
                print(
                    f"{name} at {eps:g}: {len(failed)} of {len(CHECKS)} checks failed", flush=True
                )
    smallest = {
        name: {
            check: min((float(e) for e, failed in by_size.items() if check in failed), default=None)
            for check in CHECKS
        }
        for name, by_size in results.items()
    }
    document = {
        "sizes": sizes,
        "seconds": round(time.perf_counter() - start, 1),
        "comparisons": CHECKS,
        "failed": results,
        "smallest_caught": smallest,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for name, by_check in smallest.items():
        print(f"\n{name}: the smallest relative change each check caught")
        for check, smallest_size in by_check.items():
            caught = (
                f"{smallest_size:g}"
                if smallest_size is not None
                else f"none down to {min(sizes):g}"
            )
            print(f"  {check.rpartition('::')[2]} ({CHECKS[check]}): {caught}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
