#!/usr/bin/env bash
# Every GPU check in one prepared run (under 7 minutes), for a GPU machine that has torch, Triton
# and pytest but maybe no vLLM, no nox and no network. Writes JUnit XML, the numbers and a summary
# to ${OUT:-reports/gpu}.
#
# Carries, in ${GPU_BUNDLE:-.gpu-bundle} (made beforehand by `python -m harness.gpu.bundle`),
# vLLM's sources: its Mamba kernel files, and its whole Python package without compiled parts.
# The package route is tried first (does vLLM import here, on CUDA?); when it is refused, the
# checks load the kernel files alone (harness/gpu/kernels.py). Steps, most important first:
#   kernel-route   how vLLM's kernels load here, and why (kernel-route.json)
#   kernels        vLLM's kernels against the reference at the small and both preset widths
#   reference-gpu  the rest of suites/gpu: the reference at real widths in bf16, the reference
#                  LM and towers on CUDA
#   throughput     python -m harness.gpu.throughput (throughput.json)
#   conformance    the conformance suites on the reference target with tensors on CUDA
# Each step has a time limit (400 s in all); a step that runs out is recorded as exit 124. It is
# stopped with SIGINT first, so that pytest still writes the JUnit XML of the checks that ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/gpu}"
bundle="${GPU_BUNDLE:-.gpu-bundle}"
mkdir -p "$out"
# The interpreter that holds torch: python3 on the project's test GPU, where `python` may not
# exist (a link to a virtual environment's python3 loses the environment: call it, not a link).
py="${PYTHON:-python3}"
: > "$out/steps.tsv"
export PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The time budget: each kernel's first autotune config (vLLM's own switch), no autotuning.
export VLLM_TRITON_FORCE_FIRST_CONFIG="${VLLM_TRITON_FORCE_FIRST_CONFIG:-1}"
export VLLM_TARGET_DEVICE=cuda

step() {  # step NAME SECONDS COMMAND...: run with a time limit, record exit status and time
    local name=$1 limit=$2 start status
    shift 2
    start=$(date +%s)
    timeout --signal=INT --kill-after=10 "$limit" "$@"
    status=$?
    printf '%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - start ))" >> "$out/steps.tsv"
    return 0
}

# Time-limited: a torch import that hangs (seen once on a fresh GPU machine) ends the run here.
timeout --kill-after=5 60 "$py" - > "$out/environment.txt" 2>&1 <<'PY'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__)
except ImportError as error:
    print("triton missing:", error)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")
PY
cat "$out/environment.txt"
if ! grep -q "^device " "$out/environment.txt"; then
    echo "scripts/gpu_checks.sh: $py could not report torch and the device within 60 s (above)" >&2
    exit 2
fi
if grep -q "no CUDA device" "$out/environment.txt"; then
    echo "scripts/gpu_checks.sh: needs a CUDA device (torch.cuda.is_available() is False)" >&2
    exit 2
fi

if [ -d "$bundle/vllm-kernels" ]; then
    export VLLM_KERNELS_SOURCE="$PWD/$bundle/vllm-kernels/vllm/model_executor/layers/mamba/ops"
fi
package_path=""
if [ -f "$bundle/vllm-src.tar.gz" ]; then
    package_path="$(mktemp -d)"
    tar -xzf "$bundle/vllm-src.tar.gz" -C "$package_path"
fi
# The route probe runs with vLLM's package importable; the checks keep it only if it served.
step kernel-route 20 env PYTHONPATH="${package_path}${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m harness.gpu.kernels --out "$out/kernel-route.json"
if [ -n "$package_path" ] && grep -q '"route": "vllm package"' "$out/kernel-route.json" 2>/dev/null; then
    export PYTHONPATH="${package_path}${PYTHONPATH:+:$PYTHONPATH}"
fi

step kernels 100 "$py" -m pytest suites/gpu/test_vllm_mamba_kernels.py --device cuda \
    -p no:cacheprovider -q -rA --junitxml="$out/junit-kernels.xml"
step reference-gpu 90 "$py" -m pytest suites/gpu --device cuda -p no:cacheprovider -q -rA \
    --ignore=suites/gpu/test_vllm_mamba_kernels.py --junitxml="$out/junit-gpu.xml"
step throughput 40 "$py" -m harness.gpu.throughput --out "$out/throughput.json"
step conformance 150 "$py" -m pytest suites/conformance --target reference --device cuda \
    -p no:cacheprovider -q --junitxml="$out/junit-conformance-cuda.xml" \
    --results-json="$out/results-reference-cuda.json"
"$py" -m harness.gpu.summary "$out"
