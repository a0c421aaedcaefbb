#!/usr/bin/env bash
# gpt_train as a user runs it, on the repository's test text:
#  - 2 local ranks at stage 1 = 2 MPI processes at stage 3 (losses, bit for bit);
#  - a run saved at step 4 by 2 ranks and resumed on 1 rank accumulating 2
#    micro-batches at stage 0 continues with the uninterrupted run's losses;
#  - the grid (--tp 2 --pp 2) on 4 local ranks = 4 MPI processes, and pp 2
#    over dp 2 = 2 ranks accumulating 2 micro-batches (losses, bit for bit);
#  - --mem-cap under what ZeRO alone needs chooses a tp/pp split whose
#    planned bytes are the ledger's;
#  - bad input ends with exit 2 and one line naming it.
# usage: gpt_train_cli_test.sh GPT_TRAIN TEXT [MPIEXEC]
set -euo pipefail
gpt=$1 text=$2 mpiexec=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat >"$work/config.json" <<'JSON'
{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 2,
 "n_embd": 32, "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5,
 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
JSON
common=(--config "$work/config.json" --data "$text" --seq 32 --micro-batch 2 --steps 8
        --quiet --seed $((RANDOM + 1)))
losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
fail() { echo "FAIL: $*"; exit 1; }

"$gpt" "${common[@]}" --ranks 2 --stage 1 --log-json "$work/a.jsonl" >"$work/a.out"
[ "$(losses "$work/a.jsonl" | wc -l)" = 8 ] || fail "the local run logged $(wc -l <"$work/a.jsonl") steps, not 8"
grep -q "tokens/s" "$work/a.out" || fail "no tokens/s line: $(cat "$work/a.out")"

if [ -n "$mpiexec" ]; then
  "$mpiexec" -n 2 "$gpt" "${common[@]}" --backend mpi --stage 3 --log-json "$work/b.jsonl" >"$work/b.out"
  diff <(losses "$work/a.jsonl") <(losses "$work/b.jsonl") ||
    fail "2 MPI processes at stage 3 differ from 2 local ranks at stage 1"
fi

"$gpt" "${common[@]}" --ranks 2 --stage 2 --steps 8 --checkpoint-dir "$work/ckpt" --save-every 4 \
  --log-json "$work/c1.jsonl" >/dev/null
# The run saved at steps 4 and 8; resume from step 4.
[ -d "$work/ckpt/step_00000004" ] || fail "no step_00000004 in $(ls "$work/ckpt")"
rm -rf "$work/ckpt/step_00000008"
echo step_00000004 >"$work/ckpt/latest"
"$gpt" "${common[@]}" --ranks 1 --accum 2 --stage 0 --checkpoint-dir "$work/ckpt" --resume \
  --log-json "$work/c2.jsonl" 2>"$work/c2.err" >/dev/null || fail "resume: $(cat "$work/c2.err")"
grep -q "resumed from" "$work/c2.err" || fail "no resume line: $(cat "$work/c2.err")"
diff <(losses "$work/a.jsonl" | tail -4) <(losses "$work/c2.jsonl") ||
  fail "the run resumed on 1 rank x 2 micro-batches does not continue the uninterrupted run"

# The grid: tp 2 x pp 2 on 4 local ranks = 4 MPI processes, and pp 2 over
# dp 2 = the dp-only run of 2 ranks accumulating 2 micro-batches (losses,
# bit for bit: a pipeline changes no arithmetic).
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --stage 3 --log-json "$work/g1.jsonl" >"$work/g1.out"
grep -q "as dp 1 x tp 2 x pp 2" "$work/g1.out" || fail "no grid summary: $(cat "$work/g1.out")"
[ "$(losses "$work/g1.jsonl" | wc -l)" = 8 ] || fail "the grid run logged $(wc -l <"$work/g1.jsonl") steps"
if [ -n "$mpiexec" ]; then
  "$mpiexec" --oversubscribe -n 4 "$gpt" "${common[@]}" --backend mpi --tp 2 --pp 2 --stage 3 \
    --log-json "$work/g2.jsonl" >/dev/null
  diff <(losses "$work/g1.jsonl") <(losses "$work/g2.jsonl") ||
    fail "tp 2 x pp 2: 4 MPI processes differ from 4 local ranks"
fi
"$gpt" "${common[@]}" --ranks 4 --pp 2 --stage 1 --log-json "$work/g3.jsonl" >/dev/null
"$gpt" "${common[@]}" --ranks 2 --accum 2 --stage 1 --log-json "$work/g4.jsonl" >/dev/null
diff <(losses "$work/g3.jsonl") <(losses "$work/g4.jsonl") ||
  fail "pp 2 over dp 2 differs from 2 ranks accumulating 2 micro-batches"

# The grid's validation loss (--val-every) through the pipeline: pp 2 on one
# dp rank is the one-rank run accumulating 2, validation losses included,
# bit for bit (4 windows: what both split evenly).
"$gpt" "${common[@]}" --ranks 2 --pp 2 --val-every 4 --val-windows 4 \
  --log-json "$work/v1.jsonl" >/dev/null
"$gpt" "${common[@]}" --ranks 1 --accum 2 --val-every 4 --val-windows 4 \
  --log-json "$work/v2.jsonl" >/dev/null
vals() { python3 -c 'import json,sys; [print(repr(j["val_loss"])) for j in map(json.loads, open(sys.argv[1])) if "val_loss" in j]' "$1"; }
[ "$(vals "$work/v1.jsonl" | wc -l)" = 2 ] || fail "the grid logged $(vals "$work/v1.jsonl" | wc -l) validation losses, not 2"
diff <(vals "$work/v1.jsonl") <(vals "$work/v2.jsonl") ||
  fail "the grid's validation losses differ from the one-rank run's"

# --dump-logits through the grid: pp 2 on one dp rank gives the one-rank
# run's logits bit for bit (after 2 steps); tp 2 x pp 2 those of the dp-only
# run of 4 ranks within 2 (L gamma_{4C} + gamma_V) = 6.1e-5 of the largest
# (tp reorders the row-parallel sums of one forward; measured ~1.5e-7).
"$gpt" "${common[@]}" --ranks 2 --pp 2 --steps 2 --dump-logits "$work/l1.json" >/dev/null
"$gpt" "${common[@]}" --ranks 1 --accum 2 --steps 2 --dump-logits "$work/l2.json" >/dev/null
cmp -s "$work/l1.json" "$work/l2.json" || fail "pp 2's logits differ from the one-rank run's"
# (One step at lr 1e-30: the weights stay the initial ones, so the logits
# differ by the forward's summation order only.)
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 1 --lr 1e-30 --warmup 0 \
  --dump-logits "$work/l3.json" >/dev/null
"$gpt" "${common[@]}" --ranks 4 --steps 1 --lr 1e-30 --warmup 0 --dump-logits "$work/l4.json" >/dev/null
python3 - "$work/l3.json" "$work/l4.json" <<'PY' || fail "tp 2 x pp 2's logits vs the dp-only run's"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] and len(a["logits"]) == len(b["logits"]) == 2 * 32 * 256
scale = max(abs(x) for x in b["logits"])
diff = max(abs(x - y) for x, y in zip(a["logits"], b["logits"])) / scale
u = 2.0 ** -24
gamma = lambda n: n * u / (1 - n * u)
bound = 2 * (2 * gamma(4 * 32) + gamma(256))
print(f"tp 2 x pp 2 logits: max |diff| / max |logit| = {diff:.3g} (bound {bound:.3g})")
sys.exit(0 if diff <= bound else 1)
PY

# The grid's --save-init and --dump-batches are the dp-only run's, byte for
# byte (the same initial weights, the same global batches).
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 2 --save-init "$work/si_grid" \
  --dump-batches "$work/db_grid.jsonl" >/dev/null
"$gpt" "${common[@]}" --ranks 4 --steps 2 --save-init "$work/si_dp" \
  --dump-batches "$work/db_dp.jsonl" >/dev/null
cmp -s "$work/si_grid/model.safetensors" "$work/si_dp/model.safetensors" ||
  fail "the grid's --save-init differs from the dp-only run's"
cmp -s "$work/db_grid.jsonl" "$work/db_dp.jsonl" ||
  fail "the grid's --dump-batches differs from the dp-only run's"
# --offload on the grid: the optimizer state on the host or in swap files
# (a directory per tp x pp position) trains the same run, bit for bit.
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 3 --log-json "$work/o0.jsonl" >/dev/null
for tier in host nvme; do
  dir_flags=()
  [ $tier = nvme ] && dir_flags=(--offload-dir "$work/swap")
  "$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 3 --offload optimizer=$tier \
    "${dir_flags[@]}" --log-json "$work/o_$tier.jsonl" >"$work/o_$tier.out"
  grep -q "optimizer state on the $tier tier" "$work/o_$tier.out" ||
    fail "--offload optimizer=$tier on the grid: $(cat "$work/o_$tier.out")"
  diff <(losses "$work/o0.jsonl") <(losses "$work/o_$tier.jsonl") ||
    fail "--offload optimizer=$tier on the grid changed the run"
done

# --recompute full on the grid (tp 2 x pp 2, stage 3): each block's forward
# again in the backward, the same run bit for bit.
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --stage 3 --steps 3 --recompute full \
  --log-json "$work/rc.jsonl" >/dev/null
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --stage 3 --steps 3 --log-json "$work/nr.jsonl" >/dev/null
diff <(losses "$work/rc.jsonl") <(losses "$work/nr.jsonl") ||
  fail "--recompute full on the grid changed the run"

# --init-from on the grid: those initial weights, sliced, start the same run
# as the seed's (losses bit for bit).
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 2 --init-from "$work/si_dp" \
  --log-json "$work/i1.jsonl" >/dev/null
"$gpt" "${common[@]}" --ranks 4 --tp 2 --pp 2 --steps 2 --log-json "$work/i2.jsonl" >/dev/null
diff <(losses "$work/i1.jsonl") <(losses "$work/i2.jsonl") ||
  fail "the grid run from --init-from differs from the run from the same seed"

# --mem-cap: a cap just under what ZeRO alone needs on 4 ranks makes the
# planner choose a tp/pp split; the run trains on it and its largest
# rank's engine buffers are the chosen candidate's planned bytes, under the cap.
"$gpt" "${common[@]}" --ranks 4 --steps 1 --mem-cap 1GiB >/dev/null 2>"$work/m0.err"
alone=$(grep -E '^  tp 1 x pp 1 x dp 4, stage [0-3] ' "$work/m0.err" | awk '{print $11}' | sort -n | head -1)
[ -n "$alone" ] || fail "no stage candidates in: $(cat "$work/m0.err")"
cap=$((alone - 1))
"$gpt" "${common[@]}" --ranks 4 --mem-cap "$cap" >"$work/m1.out" 2>"$work/m1.err" ||
  fail "--mem-cap $cap: $(cat "$work/m1.err")"
chosen=$(grep "chosen: the first that fits" "$work/m1.err")
case "$chosen" in
  *"tp 1 x pp 1"*|"") fail "--mem-cap $cap (ZeRO alone needs $alone): chose '$chosen'" ;;
esac
planned=$(echo "$chosen" | awk '{print $11}')
used=$(sed -n 's/.*engine buffers, largest over the ranks: \([0-9]*\) bytes.*/\1/p' "$work/m1.out")
[ "$used" = "$planned" ] && [ "$used" -le "$cap" ] ||
  fail "--mem-cap $cap: planned $planned bytes, the ledger's largest rank $used"

# Bad input: exit 2, one line naming the problem.
set +e
"$gpt" --config "$work/missing.json" --data "$text" >/dev/null 2>"$work/e1"
rc=$?
set -e
[ $rc = 2 ] && grep -q "missing.json" "$work/e1" || fail "missing config: rc $rc, $(cat "$work/e1")"
set +e
"$gpt" "${common[@]}" --seq 65 >/dev/null 2>"$work/e2"
rc=$?
set -e
[ $rc != 0 ] && grep -q "n_positions" "$work/e2" || fail "--seq 65 > n_positions: rc $rc, $(cat "$work/e2")"
set +e
"$gpt" "${common[@]}" --ranks 3 --tp 2 >/dev/null 2>"$work/e3"
rc=$?
set -e
[ $rc = 2 ] && grep -q "not a multiple of --tp 2" "$work/e3" || fail "--ranks 3 --tp 2: rc $rc, $(cat "$work/e3")"
echo "PASS"
