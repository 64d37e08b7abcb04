#!/usr/bin/env bash
# The GPU paths, measured in one short run: NCCL backend selection, the weight plane's CUDA copy
# mode (device -> pinned host -> shm -> device) and a 2-rank DDP step (benchmarks/gpu/check.py).
#
#   make gpu-check                        set up .venv (torch from PyPI: CUDA on Linux) and run
#   bash benchmarks/gpu_check.sh --mb 64  run with an existing interpreter ($PYTHON, else .venv's)
#   RLKUBE_GPU_CHECK_CPU=1 ...            force the CPU fallbacks (what the tests run)
#
# Needs only the repository and `make`; stops after GPU_CHECK_TIMEOUT seconds (default 600).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
  if [[ -x .venv/bin/python ]]; then
    python=.venv/bin/python
  else
    echo "gpu_check: no .venv; run 'make gpu-check' (or set PYTHON)" >&2
    exit 2
  fi
fi

limit="${GPU_CHECK_TIMEOUT:-600}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  echo "gpu_check: nvidia-smi not found (no NVIDIA driver): CPU fallbacks"
fi

export PYTHONPATH="${root}/runtime:${root}/operator:${root}${PYTHONPATH:+:${PYTHONPATH}}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec timeout --kill-after=10 "${limit}" "${python}" -m benchmarks.gpu.check "$@"
