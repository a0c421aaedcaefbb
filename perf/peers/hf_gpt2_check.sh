#!/usr/bin/env bash
# perf/peers/hf_gpt2_check.sh: the GPT trainer (examples/gpt) held step by
# step to Hugging Face transformers (docs/gpt.md, "Checking against Hugging
# Face"). Not part of `make test`: it downloads PyTorch and transformers.
#
#   perf/peers/hf_gpt2_check.sh [--config FILE] [--steps 100] [--seq 128]
#       [--micro-batch 4] [--runs "0:1 0:4 3:1 3:4 1:4:2x2"] [--precision fp32]
#       [--build DIR] [--trainer BIN] [--venv DIR] [--out DIR] [--threads 1]
#
# 1. A venv with torch, transformers and safetensors from the package
#    registry (perf/peers/torch_venv.sh; default build/perf/peers-venv,
#    shared with perf/peers/run.sh). If it cannot be installed the script
#    says why and exits 0 with "skipped".
# 2. For each run STAGE:RANKS[:TPxPP]: gpt_train (local ranks; with TPxPP on
#    a dp x tp x pp grid, --tp TP --pp PP) trains --steps steps
#    from its seeded initial weights, writing them first (--save-init), the
#    token batches of every step (--dump-batches), its per-step loss, lr and
#    gradient norm (--log-json), a checkpoint after the last step and the
#    logits of a fixed validation batch (--dump-logits); `zeroshard export
#    --hf` turns the checkpoint into a Hugging Face directory. (A gpt_train
#    without --save-init: its initial weights are taken from a one-step run
#    at lr 1e-30 and the same seed, exported: equal to them but for zero
#    biases that move by about 1e-30.)
# 3. hf_gpt2_check.py builds GPT2LMHeadModel from the same config.json,
#    loads the initial weights (strict), trains on the same batches with
#    torch.optim.AdamW (same groups, schedule, clipping) and prints both
#    losses per step, the final weights' max relative difference, and checks
#    that from_pretrained loads the export with no missing or unexpected key
#    and gives the trainer's logits.
#    A grid run's logits are the one-rank model's: gpt_train on one rank
#    resumes the grid's last checkpoint (no step left) and dumps them.
# 4. A table: per run, the max loss relative difference over steps 1-20 and
#    over all steps, the final weights' and the logits' max relative
#    difference. Results under --out DIR (default build/perf/hf-gpt2-check).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config="$root/examples/gpt/configs/gpt2-4l-128.json"
steps=100 seq=128 micro_batch=4 runs="0:1 0:4 3:1 3:4" precision=fp32
build="$root/build" venv="" out="" threads=1 trainer=""
lr=1e-3 min_lr_ratio=0.1 warmup=5 weight_decay=0.1 clip=1 seed=1234

usage() { sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --micro-batch) micro_batch="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --trainer) trainer="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "hf_gpt2_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
venv="${venv:-$build/perf/peers-venv}"
out="${out:-$build/perf/hf-gpt2-check}"
trainer="${trainer:-$build/examples/gpt/gpt_train}"
cli="$build/tools/zeroshard"
for bin in "$trainer" "$cli"; do
  [[ -x "$bin" ]] || { echo "hf_gpt2_check: $bin is not built (cmake --build $build --target gpt_train zeroshard_cli)" >&2; exit 2; }
done

# shellcheck source=perf/peers/torch_venv.sh
source "$root/perf/peers/torch_venv.sh"
ensure_torch_venv "$venv" torch hf_gpt2_check
if ! "$venv/bin/python" -c 'import transformers, safetensors' > /dev/null 2>&1; then
  echo "hf_gpt2_check: installing transformers and safetensors into $venv"
  "$venv/bin/pip" install transformers safetensors > "$venv/install-hf.log" 2>&1 || {
    tail -5 "$venv/install-hf.log" | sed 's/^/  /'
    echo "hf_gpt2_check: skipped: pip install transformers safetensors failed (log: $venv/install-hf.log)"
    exit 0
  }
fi
versions="$("$venv/bin/python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
echo "hf_gpt2_check: $versions; $(lscpu | sed -n 's/^Model name: *//p')"

mkdir -p "$out"
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
table="$out/table.txt"
printf '%-6s %-9s %-10s %-12s %-12s %-12s %-12s %-12s\n' stage ranks precision "loss 1-20" \
  "loss 1-$steps" "weights max" "weights L2" "logits" > "$table"
for run in $runs; do
  IFS=: read -r stage ranks grid <<<"$run"
  grid_flags=()
  label="$ranks"
  if [[ -n "$grid" ]]; then
    grid_flags=(--tp "${grid%%x*}" --pp "${grid##*x}")
    label="$ranks:$grid"
  fi
  dir="$out/stage${stage}_ranks${ranks}${grid:+_${grid}}_${precision}"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "hf_gpt2_check: stage $stage, $ranks rank(s)${grid:+ as tp x pp $grid}, $precision: training ($dir)"
  common=(--config "$config" --backend local --seq "$seq" --seed "$seed" --quiet)
  if "$trainer" --help 2>&1 | grep -q -- '--save-init'; then
    save_init=(--save-init "$dir/init")
  else
    save_init=()
    "$trainer" "${common[@]}" --steps 1 --lr 1e-30 --warmup 0 --micro-batch 1 \
      --checkpoint-dir "$dir/init-ckpt" --save-every 1 > "$dir/init.out" 2>&1 &&
      "$cli" export "$dir/init-ckpt" --hf "$dir/init" >> "$dir/init.out" 2>&1 ||
      { tail -5 "$dir/init.out"; echo "hf_gpt2_check: the initial weights' run failed" >&2; exit 1; }
  fi
  train=(--stage "$stage" --precision "$precision" --steps "$steps" --micro-batch "$micro_batch"
         --lr "$lr" --min-lr-ratio "$min_lr_ratio" --warmup "$warmup"
         --weight-decay "$weight_decay" --clip "$clip")
  # A grid run cannot dump logits: the one-rank model of its checkpoint does.
  logits_flags=(--dump-logits "$dir/logits.json")
  [[ -n "$grid" ]] && logits_flags=()
  "$trainer" "${common[@]}" --ranks "$ranks" "${grid_flags[@]}" "${train[@]}" \
    "${save_init[@]}" --dump-batches "$dir/batches.jsonl" \
    --log-json "$dir/log.jsonl" --checkpoint-dir "$dir/ckpt" --save-every "$steps" \
    "${logits_flags[@]}" > "$dir/train.out" 2>&1 ||
    { tail -5 "$dir/train.out"; echo "hf_gpt2_check: gpt_train failed (log: $dir/train.out)" >&2; exit 1; }
  if [[ -n "$grid" ]]; then
    "$trainer" "${common[@]}" --ranks 1 "${train[@]}" --checkpoint-dir "$dir/ckpt" --resume \
      --dump-logits "$dir/logits.json" > "$dir/logits.out" 2>&1 ||
      { tail -5 "$dir/logits.out"; echo "hf_gpt2_check: the one-rank logits failed" >&2; exit 1; }
  fi
  "$cli" export "$dir/ckpt" --hf "$dir/final" > "$dir/export.out" 2>&1 ||
    { cat "$dir/export.out"; exit 1; }
  "$venv/bin/python" "$root/perf/peers/hf_gpt2_check.py" --init "$dir/init" \
    --batches "$dir/batches.jsonl" --log "$dir/log.jsonl" --final "$dir/final" \
    --trainer-logits "$dir/logits.json" --lr "$lr" --warmup "$warmup" --total-steps "$steps" \
    --min-lr-ratio "$min_lr_ratio" --weight-decay "$weight_decay" --max-grad-norm "$clip" \
    --threads "$threads" --summary "$dir/summary.json" 2>&1 | grep -av 'Loading weights' |
    tee "$dir/check.out"
  "$venv/bin/python" - "$dir/summary.json" "$stage" "$label" "$precision" >> "$table" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<6} {sys.argv[3]:<9} {sys.argv[4]:<10} {s['max_rel_1_20']:<12.2e} "
      f"{s['max_rel_all']:<12.2e} {s.get('final_weights_max_rel', float('nan')):<12.2e} "
      f"{s.get('final_weights_rel_l2', float('nan')):<12.2e} "
      f"{s.get('logits_max_rel', float('nan')):<12.2e}")
PY
done
echo
echo "hf_gpt2_check: max relative differences (loss per step; final weights: the largest"
echo "per-tensor max|hf - zs| / max|zs|, and ||hf - zs|| / ||zs|| over all; logits of"
echo "from_pretrained(export) vs the trainer's on a fixed validation batch):"
cat "$table"
