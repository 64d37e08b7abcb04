#!/usr/bin/env bash
# Everything a short lease of one GPU machine with no network should measure, in one command that
# ends inside ~9 minutes and leaves at most 8 files. Each section has its own time limit, so one that
# hangs or runs long costs only its share; every figure is also printed as it is measured.
#
#   sections, in this order (limits in seconds; DEVICE_<NAME>_SECONDS changes one, DEVICE_SECTIONS
#   picks some, DEVICE_WORKERS the worker counts, default 1 4 8 14):
#     rollout-cpu 120  rlkube bench rollout, async, batched requests, CUDA hidden: issue #24's table
#     rollout     110  the same with the learner on the GPU
#     profile      60  py-spy on train rank 0 and eval worker 0 with the most workers, 10 s
#                      (python -m benchmarks.rollout.profile; raw profiles in profiles.tar.gz)
#     intake       45  rlkube bench intake, the same counts of producers, training off
#     gpu-check   180  make gpu-check's sections (CartPole to target on the GPU, HalfCheetah GPU vs
#                      CPU learner, checkpoint + SIGKILL + resume, CUDA weight plane, placement)
#
# Prepared here (with network), carried there:
#   make wheelhouse        # .whl/: the wheels the machine lacks (Python 3.12, x86-64; torch is there)
#   run: bash benchmarks/device_session.sh "$OUT"      carry: .whl
# Without .whl/ (DEVICE_WHEELS names another folder) the machine's own packages are used; gpu-check names any that are missing.
# Exit status: 1 when a section failed (a section stopped at its limit is not a failure), 2 when
# the wheels did not install.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}" || exit 2
out="${1:-${OUT:-runs/device}}"
mkdir -p "${out}"
python="${PYTHON:-python3}"
read -ra workers <<<"${DEVICE_WORKERS:-1 4 8 14}"
sections="${DEVICE_SECTIONS:-rollout-cpu rollout profile intake gpu-check}"

wheels="${DEVICE_WHEELS:-.whl}"
site="$(mktemp -d /tmp/rlkube-site.XXXXXX)"
profiles="$(mktemp -d /tmp/rlkube-profiles.XXXXXX)"
trap 'rm -rf "${site}" "${profiles}"' EXIT
if compgen -G "${wheels}/*.whl" >/dev/null; then
  "${python}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "${site}" "${wheels}"/*.whl || { echo "device_session: the wheels in ${wheels} did not install" >&2; exit 2; }
  export PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" PATH="${site}/bin:${PATH}"
fi
export PYTHONPATH="${root}/runtime:${root}/operator:${root}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1

{
  date -u
  echo "cores: $(nproc), revision: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  "${python}" - <<'EOF' 2>&1
import importlib.metadata as m
import sys

print("python", sys.version.split()[0])
for name in ("torch", "numpy", "tensordict", "gymnasium", "grpcio", "protobuf", "pydantic", "mujoco"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "missing")
import torch

print("cuda available:", torch.cuda.is_available(), torch.cuda.device_count(), "device(s)")
EOF
} >"${out}/summary.txt"
cat "${out}/summary.txt"
summary="${out}/summary.txt"
section() {  # section NAME DEFAULT_SECONDS COMMAND...
  local name="$1" limit="$2" started="${SECONDS}" rc
  shift 2
  [[ " ${sections} " == *" ${name} "* ]] || return 0
  local variable="DEVICE_${name^^}_SECONDS"
  variable="${variable//-/_}"
  limit="${!variable:-${limit}}"
  echo "== ${name} (at most ${limit} s)"
  timeout --kill-after=10 "${limit}" "$@" >"${out}/${name}.log" 2>&1
  rc=$?
  local verdict="ok"
  ((rc == 124 || rc == 137)) && verdict="stopped at its limit"
  ((rc != 0 && rc != 124 && rc != 137)) && verdict="failed"
  echo "${name}: ${verdict} (rc ${rc}) after $((SECONDS - started)) s" | tee -a "${summary}"
  tail -n 25 "${out}/${name}.log"
}

{
  rollout=(-m rlkube.cli bench rollout --workers "${workers[@]}" --engines async --requests batched --no-ray
    --epochs 40 --bound-repeats 2 --ceiling-seconds 0)
  section rollout-cpu 120 env CUDA_VISIBLE_DEVICES= "${python}" "${rollout[@]}"
  section rollout 110 "${python}" "${rollout[@]}" --json "${out}/rollout-gpu.json"
  section profile 60 "${python}" -m benchmarks.rollout.profile --workers "${workers[-1]}" --seconds 10 \
    --out "${profiles}"
  if compgen -G "${profiles}/*" >/dev/null; then tar -czf "${out}/profiles.tar.gz" -C "${profiles}" .; fi
  section intake 45 "${python}" -m rlkube.cli bench intake --producers "${workers[@]}" --seconds 3 --warmup 1
  section gpu-check 180 env PYTHON="${python}" GPU_CHECK_TIMEOUT=170 bash benchmarks/gpu_check.sh --epochs 4
}
cat "${summary}"
! grep -q ": failed (rc" "${summary}"
