#!/usr/bin/env bash
# The GPU acceptance check (benchmarks/gpu/check.py): the product on one GPU machine in ~5 minutes,
# ending with one table. `rlkube run` CartPole to its target with the learner on the GPU; HalfCheetah
# with 8 eval workers, GPU learner against CPU learner; checkpoint on the GPU, SIGKILL, resume; the
# weight plane in CUDA mode (publish and load GB/s at 100 MB and 1 GB beside the copy_ ceilings);
# the placement refusal; 2 DDP ranks over NCCL where a second GPU exists.
#
#   make gpu-check                          set up .venv (torch from PyPI: CUDA on Linux) and run
#   PYTHON=python3 bash benchmarks/gpu_check.sh            run with an existing interpreter
#   bash benchmarks/gpu_check.sh --only weights --mb 1024  one section (see --help)
#   RLKUBE_GPU_CHECK_CPU=1 ...              force the CPU fallbacks (what the tests run)
#
# Needs the repository and the Python packages it names when they are missing (exit 2); stops after
# GPU_CHECK_TIMEOUT seconds (default 600). Exit 1 when a section failed.
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
