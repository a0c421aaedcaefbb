#!/usr/bin/env bash
# A GPT run on a tp 2 x pp 2 grid of 4 MPI processes that saves every 20
# steps loses rank 2 to SIGKILL; the survivors end naming it. Its last
# checkpoint is one checkpoint of the whole model: `zeroshard inspect`
# verifies it, `zeroshard export --hf` exports it, and it resumes
#  - on the same grid (local ranks): the uninterrupted run's losses, bit for bit;
#  - on dp 4 x tp 1 x pp 1 (4 MPI processes, the data-parallel trainer),
#    continuing to the end, within the tensor-parallel bound of the
#    uninterrupted run (steps x 2 (L gamma_{4C} + gamma_V), the bound of
#    gpt_grid_trainer_test, here 2 layers, C 32, V 256).
#
#   gpt_grid_resume_test.sh MPIEXEC GPT_TRAIN ZEROSHARD TEXT
set -u
mpiexec=$1
demo=$2
zeroshard=$3
text=$4
timeout_s=10
steps=300
work=$(mktemp -d)
# shellcheck source=tests/examples/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
export ZS_COMM_TIMEOUT=$timeout_s
ckpt=$work/ckpt
cat >"$work/config.json" <<'JSON'
{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 2,
 "n_embd": 32, "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5,
 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
JSON
flags=(--config "$work/config.json" --data "$text" --seq 32 --micro-batch 2 --steps "$steps"
       --seed $((RANDOM + 1)) --quiet --stage 1)
losses() { python3 -c 'import json,sys; [print(json.loads(l)["step"], repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }

# 0. The uninterrupted run (local ranks; the same arithmetic as MPI processes).
"$demo" "${flags[@]}" --ranks 4 --tp 2 --pp 2 --log-json "$work/full.jsonl" >/dev/null 2>&1 ||
  fail "the uninterrupted grid run failed"

# 1. The run that loses a rank.
launch_demo "$work/killed.out" 4 -- "${flags[@]}" --tp 2 --pp 2 --save-every 20 \
  --checkpoint-dir "$ckpt"
wait_for_ranks 4 || fail "the 4 ranks did not all start: $(cat "$work/killed.out")"
pid=$(echo "$rank_pids" | sed -n 's/^2://p')
for _ in $(seq 1 1200); do
  latest=$(cat "$ckpt/latest" 2>/dev/null)
  [ "${latest#step_}" ] && [ "$((10#${latest#step_}))" -ge 40 ] 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || fail "the run ended before its step-40 checkpoint"
  sleep 0.05
done
kill -STOP "$pid" || fail "could not stop rank 2"
latest=$(cat "$ckpt/latest")
[ "$((10#${latest#step_}))" -lt "$steps" ] || fail "the run finished before the kill"
start_ms=$(now_ms)
kill -KILL "$pid" || fail "could not kill rank 2 (pid $pid)"
wait_for_exit 60 || fail "the job was still running 60 s after rank 2 was killed"
echo "SIGKILL of rank 2 after checkpoint $latest: the job ended in $(seconds "$elapsed_ms") s, exit $rc"
[ "$rc" != 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -Eq "run failed: .*(rank 2 \\(|\\(world rank 2, )pid $pid on [^)]*\\) died" "$work/killed.out" ||
  fail "no survivor named rank 2 as dead: $(grep 'run failed' "$work/killed.out" | head -3)"
resumed_from=$(cat "$ckpt/latest")
at=$((10#${resumed_from#step_}))

# 2. The checkpoint is one ordinary checkpoint of the whole model.
"$zeroshard" inspect "$ckpt" >"$work/inspect.out" 2>&1 || fail "inspect: $(cat "$work/inspect.out")"
grep -q "written by  4 rank(s)" "$work/inspect.out" && grep -q "all sound" "$work/inspect.out" ||
  fail "inspect: $(cat "$work/inspect.out")"
"$zeroshard" export "$ckpt" --hf "$work/hf" >"$work/export.out" 2>&1 ||
  fail "export --hf: $(cat "$work/export.out")"
[ -s "$work/hf/model.safetensors" ] && [ -s "$work/hf/config.json" ] ||
  fail "export --hf wrote $(ls "$work/hf")"

# 3. Resumed on the same grid: the uninterrupted run's losses, bit for bit.
cp -r "$ckpt" "$work/ckpt_copy"
"$demo" "${flags[@]}" --ranks 4 --tp 2 --pp 2 --checkpoint-dir "$ckpt" --resume \
  --log-json "$work/same.jsonl" >/dev/null 2>"$work/same.err" || fail "resume on the grid: $(cat "$work/same.err")"
diff <(losses "$work/full.jsonl" | awk -v at="$at" '$1 > at') <(losses "$work/same.jsonl") ||
  fail "the grid resumed from $resumed_from does not continue the uninterrupted run"

# 4. Resumed on dp 4 x tp 1 x pp 1 (4 MPI processes, the data-parallel trainer).
launch_demo "$work/dp.out" 4 -- "${flags[@]}" --checkpoint-dir "$work/ckpt_copy" --resume \
  --log-json "$work/dp.jsonl"
wait_for_exit 300 || fail "the dp 4 resume did not finish within 300 s"
[ "$rc" = 0 ] || fail "the dp 4 resume failed: $(cat "$work/dp.out")"
grep -q "resumed from $work/ckpt_copy/$resumed_from: step $at, written by 4 rank(s)" "$work/dp.out" ||
  fail "the dp 4 run did not say what it resumed from: $(grep resumed "$work/dp.out")"
[ "$(losses "$work/dp.jsonl" | tail -1 | cut -d' ' -f1)" = "$steps" ] ||
  fail "the dp 4 run did not reach step $steps"
python3 - "$work/full.jsonl" "$work/dp.jsonl" "$at" "$steps" <<'PY' || fail "dp 4 resume vs the grid"
import json, sys
full = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1]))}
dp = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2]))}
at, steps = int(sys.argv[3]), int(sys.argv[4])
u = 2.0 ** -24
gamma = lambda n: n * u / (1 - n * u)
bound = (steps - at) * 2 * (2 * gamma(4 * 32) + gamma(256))
worst = max(abs(dp[s] - full[s]) / full[s] for s in range(at + 1, steps + 1))
print(f"dp 4 resumed from step {at}: largest relative loss difference to the grid run {worst:.3g} over {steps - at} steps (bound {bound:.3g})")
sys.exit(0 if worst <= bound else 1)
PY
echo "PASS"
