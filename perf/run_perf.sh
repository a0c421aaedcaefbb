#!/usr/bin/env bash
# `make perf`: every layer measured alone, then the whole, into one folder:
#   kernels.json              adam_bench: AdamW (fp32, bf16-, fp16-mixed), casts, norms
#                             against a copy and an in-place RMW of the same bytes
#   collectives_local.json    collective_bench, local backend, 2-4 ranks, 1 KiB-256 MiB
#   collectives_mpi_npN.json  the same on mpi, N = 2, 3, 4 (with --mpi)
#   offload.json              offload_bench: the optimizer phase of the host and
#                             NVMe tiers against the host AdamW, the copies, the
#                             streams baseline and the disk's own time (swap files
#                             under OFFLOAD_DIR, default a fresh /tmp directory);
#                             the step per tier
#   step_local.json           step_bench: stages 0-3 on 1, 2, 4 ranks (local)
#   step_mpi_npN.json         the same on mpi, N = 1, 2, 4 (with --mpi)
#   machine.json              zeroshard calibrate: this machine's profile (sgemm,
#                             GELU, copy, optimizer; local and mpi collectives)
#   multinode_zeropp.json     perf/multinode/zeropp_bench.sh (as root, with MPI): mlp_demo
#                             at stage 3 on emulated nodes (2 x 2, 4 x 1; links unshaped
#                             and 1 Gbit/s), exact and with each ZeRO++ option: bytes
#                             across nodes per step (engine and interfaces), step time
#   predicted_B_npN.json      zeroshard estimate --machine: the calibrated model's
#                             step time for every stage, backend B, N ranks, given
#                             the CPUs per rank the step run measured
#                             (--cpus-per-rank; 0 when not bound)
# then report.md, report.html and the SVG charts (perf/report/make_report.py)
# and, when chromium is installed, a PNG of each chart (perf/report/screenshot.sh).
#
# usage: perf/run_perf.sh [--build-dir DIR] [--out DIR] [--mpi | --no-mpi] [--smoke]
#   --build-dir DIR  the CMake build (default build)
#   --out DIR        where the results go (default BUILD_DIR/perf)
#   --mpi            also the mpi backend (default: when mpirun is on PATH
#                    and the build has MPI); --no-mpi: local only
#   --smoke          tiny sizes, 2 ranks, 1 step: checks that every layer
#                    runs and the report is written (ctest perf_pipeline_smoke);
#                    its numbers mean nothing
#   --price X        USD per device-hour for the cost per epoch (default 2.0)
# Exit 0 when every layer ran and the report checks out; the first failure
# otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="${root}/build"
out=""
mpi=auto
smoke=0
price=2.0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --mpi) mpi=1; shift ;;
    --no-mpi) mpi=0; shift ;;
    --smoke) smoke=1; shift ;;
    --price) price="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_perf.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
out="${out:-${build_dir}/perf}"
mkdir -p "${out}"
adam_bench="${build_dir}/perf/kernels/adam_bench"
collective_bench="${build_dir}/perf/comm/collective_bench"
step_bench="${build_dir}/perf/runtime/step_bench"
offload_bench="${build_dir}/perf/runtime/offload_bench"
zeroshard="${build_dir}/tools/zeroshard"
for b in "${adam_bench}" "${collective_bench}" "${step_bench}" "${offload_bench}" "${zeroshard}" \
  "${build_dir}/tools/zeroshard-calibrate"; do
  [[ -x "${b}" ]] || { echo "run_perf.sh: ${b} is not built (make perf builds it)" >&2; exit 2; }
done
if [[ "${mpi}" == auto ]]; then
  mpi=0
  # (Not `ldd | grep -q`: under pipefail grep's early exit fails the pipe.)
  if command -v mpirun >/dev/null && [[ "$(ldd "${collective_bench}")" == *libmpi* ]]; then
    mpi=1
  fi
fi
# Containers often lack the ptrace rights of shared memory's single-copy
# mechanism; copying through shared memory works everywhere.
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [[ ${smoke} -eq 1 ]]; then
  kernel_env=(ZS_BENCH_N=65536)
  kernel_args=(--pairs 2)
  coll_args=(--max-bytes 65536 --factor 16 --max-iters 5)
  coll_ranks=(2)
  step_args=(--steps 1 --warmup 1 --hidden 32 --blocks 2 --stages 0,3)
  step_ranks=(1 2)
  # The same model as the smoke step runs.
  model_args=(--hidden 32 --blocks 2 --micro-batch 16)
  calib_args=(--min-seconds 0.02 --sizes 1024,16384)
  calib_ranks=(2)
  offload_args=(--params 256K --units 3 --chunk 16K --repeats 1 --no-dd --step-repeats 1
    --step-steps 2 --hidden 32 --blocks 2 --micro-batch 4)
else
  # 32M elements: every kernel's buffers are far beyond the caches.
  kernel_env=(ZS_BENCH_N=33554432)
  kernel_args=(--pairs 11)
  coll_args=()
  coll_ranks=(2 3 4)
  step_args=(--steps 20 --warmup 3 --price-per-device-hour "${price}")
  step_ranks=(1 2 4)
  # The model of issue 12's acceptance: 8 blocks x hidden 512 (16.8M
  # params), micro-batch 32 per rank.
  model_args=(--hidden 512 --blocks 8 --micro-batch 32)
  calib_args=()
  calib_ranks=(2 4)
  # The default state (64M params, fp32 and bf16) and 5 repeats.
  offload_args=(--repeats 5)
fi
rm -f "${out}"/*.json "${out}"/*.svg "${out}"/*.png "${out}"/report.md "${out}"/report.html
start=${SECONDS}
stamp() { echo "run_perf.sh: [$((SECONDS - start)) s] $*"; }

# Calibrate first, on the machine as the benchmarks find it: one profile for
# every prediction below (no per-run constants).
stamp "calibrate (zeroshard calibrate)"
calib_list=$(IFS=,; echo "${calib_ranks[*]}")
"${zeroshard}" calibrate --out "${out}/machine.json" --ranks "${calib_list}" "${model_args[@]}" \
  "${calib_args[@]}"
if [[ ${mpi} -eq 1 && ${smoke} -eq 0 ]]; then
  for n in "${calib_ranks[@]}"; do
    stamp "calibrate, mpi collectives, ${n} processes"
    "${mpirun_cmd[@]}" -np "${n}" "${zeroshard}" calibrate --backend mpi --what collectives \
      --out "${out}/machine.json" "${calib_args[@]}"
  done
fi

stamp "kernels (adam_bench)"
env "${kernel_env[@]}" "${adam_bench}" --paired-only "${kernel_args[@]}" --json "${out}/kernels.json"

stamp "offload tiers (offload_bench)"
offload_dir_args=()
[[ -n "${OFFLOAD_DIR:-}" ]] && offload_dir_args=(--offload-dir "${OFFLOAD_DIR}")
"${offload_bench}" "${offload_args[@]}" "${offload_dir_args[@]}" --json "${out}/offload.json"

stamp "collectives, local backend (collective_bench)"
ranks_list=$(IFS=,; echo "${coll_ranks[*]}")
"${collective_bench}" --ranks "${ranks_list}" "${coll_args[@]}" --json "${out}/collectives_local.json"
if [[ ${mpi} -eq 1 && ${smoke} -eq 0 ]]; then
  for n in "${coll_ranks[@]}"; do
    stamp "collectives, mpi backend, ${n} processes"
    "${mpirun_cmd[@]}" -np "${n}" "${collective_bench}" --backend mpi "${coll_args[@]}" \
      --json "${out}/collectives_mpi_np${n}.json"
  done
fi

stamp "engine step, local backend (step_bench)"
ranks_list=$(IFS=,; echo "${step_ranks[*]}")
"${step_bench}" --ranks "${ranks_list}" "${step_args[@]}" "${model_args[@]}" --json "${out}/step_local.json"
if [[ ${mpi} -eq 1 && ${smoke} -eq 0 ]]; then
  for n in "${step_ranks[@]}"; do
    stamp "engine step, mpi backend, ${n} processes"
    "${mpirun_cmd[@]}" -np "${n}" "${step_bench}" --backend mpi "${step_args[@]}" "${model_args[@]}" \
      --json "${out}/step_mpi_np${n}.json"
  done
fi

stamp "calibrated model (zeroshard estimate --machine)"
backends=(local)
[[ ${mpi} -eq 1 && ${smoke} -eq 0 ]] && backends+=(mpi)
for backend in "${backends[@]}"; do
  for n in "${step_ranks[@]}"; do
    # mpirun binds each rank to one core at np <= 2: the model gets the
    # binding the step run measured (0 when its ranks could use every core).
    cpus=$(python3 "${root}/perf/report/make_report.py" --dir "${out}" \
      --cpus-per-rank "${backend}" "${n}")
    "${zeroshard}" estimate --machine "${out}/machine.json" --model mlp "${model_args[@]}" \
      --gpus "${n}" --backend "${backend}" --cpus-per-rank "${cpus}" --json \
      >"${out}/predicted_${backend}_np${n}.json"
  done
done

expect=step,collectives,kernels,model,offload
if [[ ${mpi} -eq 1 && "$(id -u)" -eq 0 && -x "${build_dir}/examples/mlp/mlp_demo" ]]; then
  stamp "ZeRO++ across emulated nodes (perf/multinode/zeropp_bench.sh)"
  zeropp_args=()
  [[ ${smoke} -eq 1 ]] && zeropp_args=(--smoke)
  "${root}/perf/multinode/zeropp_bench.sh" "${build_dir}/examples/mlp/mlp_demo" \
    "${out}/multinode_zeropp.json" "${zeropp_args[@]}"
  expect+=,multinode
else
  stamp "ZeRO++ across emulated nodes: skipped (needs root, mpirun and mlp_demo)"
fi

stamp "report"
python3 "${root}/perf/report/make_report.py" --dir "${out}" --check --expect "${expect}"
if [[ ${smoke} -eq 0 ]]; then
  if ! "${root}/perf/report/screenshot.sh" "${out}"; then
    echo "run_perf.sh: the charts were not rendered to PNG (see above); the report itself is written"
  fi
fi
stamp "done: ${out}/report.md (and report.html, *.svg, *.json)"
