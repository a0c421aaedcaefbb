#!/usr/bin/env bash
# perf/peers: zeroshard next to PyTorch on the same machine, same model,
# batch, steps and rank count (docs/perf.md, "PyTorch side by side").
#
#   perf/peers/run.sh [--hidden 512] [--blocks 8] [--micro-batch 32]
#                     [--steps 20] [--warmup 3] [--ranks "1 2 4"] [--repeats 3]
#                     [--build DIR] [--venv DIR] [--out FILE] [--torch-spec SPEC]
#                     [--no-train] [--no-adam]
#
# 1. A venv with PyTorch from the package registry (default
#    build/perf/peers-venv, reused when it imports torch). If it cannot be
#    installed the script says why and exits 0 with "skipped": it never
#    prints numbers it did not measure.
# 2. Step time: for each rank count, mlp_demo (--backend mpi under mpirun)
#    at ZeRO stage 0 and 1 against torch_mlp.py (torchrun, gloo) with DDP and
#    with DDP + ZeroRedundancyOptimizer, one process per rank, one compute
#    thread per rank on both sides.
# 3. AdamW fp32 at 64M elements: adam_bench against torch_adam.py (fused CPU
#    AdamW) and the copy / read-modify-write streams of the same bytes.
# Runs interleave (zeroshard, PyTorch, zeroshard, PyTorch, ...) for every
# configuration, repeated --repeats times, so both see the same machine;
# compare.py prints the medians side by side and writes --out (default
# build/perf/peers.json). Not part of `make test`: it takes minutes and
# downloads PyTorch.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
hidden=512 blocks=8 micro_batch=32 steps=20 warmup=3 ranks="1 2 4" repeats=3
build="$root/build" venv="" out="" torch_spec="torch" do_train=1 do_adam=1

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hidden) hidden="$2"; shift 2 ;;
    --blocks) blocks="$2"; shift 2 ;;
    --micro-batch) micro_batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --torch-spec) torch_spec="$2"; shift 2 ;;
    --no-train) do_train=0; shift ;;
    --no-adam) do_adam=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "perf/peers: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
venv="${venv:-$root/build/perf/peers-venv}"
out="${out:-$root/build/perf/peers.json}"
raw="$root/build/perf/peers-raw"

mlp_demo="$build/examples/mlp/mlp_demo"
adam_bench="$build/perf/kernels/adam_bench"
for bin in "$mlp_demo" "$adam_bench"; do
  if [[ ! -x "$bin" ]]; then
    echo "perf/peers: $bin is missing: build first (make, Release), or pass --build DIR" >&2
    exit 1
  fi
done
if [[ $do_train -eq 1 ]] && ! command -v mpirun > /dev/null; then
  echo "perf/peers: mpirun not found: zeroshard's multi-process runs need Open MPI" >&2
  exit 1
fi

# --- PyTorch from the package registry --------------------------------------
# shellcheck source=perf/peers/torch_venv.sh
source "$root/perf/peers/torch_venv.sh"
ensure_torch_venv "$venv" "$torch_spec" perf/peers
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
echo "perf/peers: PyTorch $torch_version ($venv); zeroshard binaries from $build"

rm -rf "$raw"
mkdir -p "$raw/bin" "$(dirname "$out")"
# Run copies of the binaries (statically linked against the project's
# libraries): a rebuild of the build tree during the run cannot mix versions.
cp "$mlp_demo" "$adam_bench" "$raw/bin/"
mlp_demo="$raw/bin/mlp_demo"
adam_bench="$raw/bin/adam_bench"
adam_json=()  # adam_bench --json: its paired table with the RMW baseline, where it has it
if grep -q -a -- '--paired-only' "$adam_bench"; then adam_json=(--json); fi
cat > "$raw/meta.json" << EOF
{"hidden": $hidden, "blocks": $blocks, "micro_batch": $micro_batch, "steps": $steps,
 "warmup": $warmup, "ranks": "$ranks", "repeats": $repeats, "torch": "$torch_version",
 "build": "$build", "nproc": $(nproc), "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
 "threads_per_rank": 1}
EOF

mpirun_flags=(--allow-run-as-root --oversubscribe --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none)
model=(--hidden "$hidden" --blocks "$blocks" --micro-batch "$micro_batch" --steps "$steps")

# Runs "$@" with its output in $1 (a file under $raw); a failure ends the
# script naming the log, never a guessed number.
run_logged() {
  local log="$1"
  shift
  if ! timeout 1800 "$@" > "$log" 2> "$log.err"; then
    echo "perf/peers: failed: $* (stdout $log, stderr $log.err):" >&2
    tail -5 "$log.err" >&2
    exit 1
  fi
}

# torchrun's run $1.json: like run_logged, but a non-zero exit after rank 0
# wrote the JSON (written only once every rank has finished every step, see
# torch_mlp.py) is a teardown abort in gloo, not a failed measurement: it
# warns and keeps the numbers.
run_torch() {
  local base="$1"
  shift
  if ! timeout 1800 "$@" > "$base.log" 2> "$base.log.err"; then
    if [[ -s "$base.json" ]] && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$base.json"; then
      echo "perf/peers: warning: torchrun exited non-zero after all steps (teardown; $base.log.err)" >&2
      return 0
    fi
    echo "perf/peers: failed: $* (stdout $base.log, stderr $base.log.err):" >&2
    grep -v '^W[0-9]' "$base.log.err" | tail -8 >&2
    exit 1
  fi
}

optim_of_stage=(ddp zero)
for ((k = 1; k <= repeats; k++)); do
  if [[ $do_train -eq 1 ]]; then
    for n in $ranks; do
      for stage in 0 1; do
        optim="${optim_of_stage[$stage]}"
        echo "perf/peers: repeat $k/$repeats: $n rank(s), zeroshard stage $stage, then PyTorch $optim"
        # --sync-data: PyTorch's data are made before its timed loop, so
        # zeroshard makes each micro-batch on the trainer's thread, booked as
        # input wait, which the comparison subtracts. (The background loader
        # would hide it, but under mpirun's one-core-per-rank binding its
        # teacher forward shares the rank's core with the trainer.)
        run_logged "$raw/z_r${n}_s${stage}_$k.txt" \
          mpirun "${mpirun_flags[@]}" -np "$n" "$mlp_demo" --backend mpi --stage "$stage" \
          --sync-data "${model[@]}"
        run_torch "$raw/t_r${n}_${optim}_$k" \
          "$venv/bin/torchrun" --standalone --nproc-per-node "$n" "$root/perf/peers/torch_mlp.py" \
          "${model[@]}" --warmup "$warmup" --optim "$optim" --threads 1 \
          --json "$raw/t_r${n}_${optim}_$k.json"
      done
    done
  fi
  if [[ $do_adam -eq 1 ]]; then
    echo "perf/peers: repeat $k/$repeats: AdamW 64M, zeroshard adam_bench, then PyTorch"
    run_logged "$raw/z_adam_$k.txt" "$adam_bench" --benchmark_filter='^(adamw_fp32|copy_28B)/' \
      ${adam_json[@]+"${adam_json[@]}" "$raw/z_adam_$k.json"}
    run_logged "$raw/t_adam_$k.log" "$venv/bin/python" "$root/perf/peers/torch_adam.py" \
      --json "$raw/t_adam_$k.json"
  fi
done

python3 "$root/perf/peers/compare.py" "$raw" "$out"
