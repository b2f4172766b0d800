#!/usr/bin/env bash
# Every GPU check in one short run, for a GPU machine that has torch but no nox and no network.
# Writes JUnit XML and per-check results to ${OUT:-reports/gpu}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/gpu}"
mkdir -p "$out"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
status=0
python -m pytest suites -m gpu --device cuda -p no:cacheprovider -q -rA \
    --junitxml="$out/junit-gpu.xml" || status=$?
# The conformance suites on the reference target with tensors on CUDA.
python -m pytest suites/conformance --target reference --device cuda -p no:cacheprovider -q \
    --junitxml="$out/junit-conformance-cuda.xml" --results-json="$out/results-reference-cuda.json" \
    || status=$?
exit $status
