#!/usr/bin/env bash
# perf/peers/gpt_side_by_side.sh: the GPT trainer (examples/gpt, gpt_train)
# next to the same Hugging Face GPT2LMHeadModel trained by PyTorch DDP,
# PyTorch FSDP2 (fully_shard) and DeepSpeed ZeRO-1 / ZeRO-3 on the CPU, at the
# same config, micro-batch, seq, steps, precision and process count
# (docs/perf.md, "GPT side by side").
#
#   perf/peers/gpt_side_by_side.sh [--config FILE | --layers 4 --heads 4
#       --width 128 --positions 128 --vocab 256] [--seq 128] [--micro-batch 8]
#       [--data FILE] [--steps 20] [--warmup 3] [--ranks "1 2 4"]
#       [--precisions "fp32 bf16"] [--frameworks "zeroshard ddp fsdp2 ds1 ds3"]
#       [--zs-stages "0 1 3"] [--repeats 2] [--no-split] [--build DIR]
#       [--venv DIR] [--out FILE] [--torch-spec SPEC] [--deepspeed-spec SPEC]
#
# 1. A venv from the package registry (default build/perf/peers-venv, shared
#    with run.sh): torch and numpy (torch_venv.sh), then transformers and
#    deepspeed (DS_BUILD_OPS=0: no op is compiled at install). If torch or
#    transformers cannot be installed the script says why and exits 0 with
#    "skipped"; if deepspeed cannot, its rows say so and the rest runs.
# 2. Measures the single-thread GEMM peak in the venv (gemm_peak.py:
#    torch.mm at 2048^3, fp32 and bf16), before the runs and after them:
#    the better of the two is MFU's denominator.
# 3. For each repeat and rank count, in this order (interleaved runs:
#    zeroshard, its peer, zeroshard, its peer, ...):
#      zeroshard stage 0, PyTorch DDP, zeroshard stage 1, DeepSpeed ZeRO-1,
#      zeroshard stage 3, DeepSpeed ZeRO-3, PyTorch FSDP2
#    (zeroshard: one run per precision; a peer: one launch measuring each
#    precision in turn, from a fresh model each time)
#    zeroshard: gpt_train (under mpirun with --backend mpi when the binary
#    has it, else its --ranks N local backend); peers: torch_gpt.py under
#    the venv's torchrun, gloo. One compute thread per process on every
#    side (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)).
#    A framework that fails is reported with its error and left out of the
#    later repeats; the others go on.
# 4. In the first repeat (unless --no-split), each peer's launch also makes
#    an instrumented measurement per precision (torch_gpt.py --split-json: a
#    barrier after each phase; DDP also times its backward under no_sync for
#    the exposed all-reduce).
# 5. gpt_compare.py prints tokens/s per run, the medians, the ratios
#    zeroshard / DDP and zeroshard / DeepSpeed, the step-time split and MFU,
#    and writes --out (default build/perf/gpt_peers.json); raw outputs in
#    build/perf/gpt-peers-raw/.
# Not part of `make test`: it downloads PyTorch and DeepSpeed (~6 GB) and
# takes tens of minutes on 2 cores (the first DeepSpeed start also
# JIT-compiles its shared-memory comm op, minutes, once). With more processes
# than cores (4 on this 2-core machine) every side is oversubscribed; the
# output says so.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
config="" layers=4 heads=4 width=128 positions=128 vocab=256 seq=128 micro_batch=8
data="" steps=20 warmup=3 ranks="1 2 4" precisions="fp32 bf16"
frameworks="zeroshard ddp fsdp2 ds1 ds3" zs_stages="0 1 3" repeats=2 do_split=1
build="$root/build" venv="" out="" torch_spec="torch" ds_spec="deepspeed"

usage() { sed -n '2,47p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --positions) positions="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --micro-batch) micro_batch="$2"; shift 2 ;;
    --data) data="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --frameworks) frameworks="$2"; shift 2 ;;
    --zs-stages) zs_stages="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --no-split) do_split=0; shift ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --torch-spec) torch_spec="$2"; shift 2 ;;
    --deepspeed-spec) ds_spec="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "perf/peers/gpt: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
venv="${venv:-$root/build/perf/peers-venv}"
out="${out:-$root/build/perf/gpt_peers.json}"
raw="$root/build/perf/gpt-peers-raw"
name=perf/peers/gpt
has() { [[ " $frameworks " == *" $1 "* ]]; }

gpt_train="$build/examples/gpt/gpt_train"
if has zeroshard; then
  if [[ ! -x "$gpt_train" ]]; then
    echo "$name: $gpt_train is missing: build it (cmake --build build --target gpt_train)," \
      "pass --build DIR, or leave zeroshard out with --frameworks" >&2
    exit 1
  fi
fi

# --- the data: the same bytes for every framework ---------------------------
if [[ -z "$data" ]]; then
  if [[ -s "$root/tests/data/gpt_text.txt" ]]; then
    data="$root/tests/data/gpt_text.txt"
  else
    echo "$name: no --data and no tests/data/gpt_text.txt: pass --data FILE (a text file," \
      "read as bytes)" >&2
    exit 1
  fi
fi
[[ -s "$data" ]] || { echo "$name: --data $data is missing or empty" >&2; exit 1; }

# --- the venv ----------------------------------------------------------------
# shellcheck source=perf/peers/torch_venv.sh
source "$root/perf/peers/torch_venv.sh"
ensure_torch_venv "$venv" "$torch_spec" "$name"
py="$venv/bin/python"
if ! "$py" -c 'import transformers' > /dev/null 2>&1; then
  echo "$name: installing transformers into $venv"
  if ! "$venv/bin/pip" install transformers safetensors > "$venv/install-transformers.log" 2>&1; then
    tail -5 "$venv/install-transformers.log" | sed 's/^/  /'
    echo "$name: skipped: pip install transformers failed (log: $venv/install-transformers.log)"
    exit 0
  fi
fi
ds_error=""
if has ds1 || has ds3; then
  if ! DS_ACCELERATOR=cpu "$py" -c 'import deepspeed' > /dev/null 2>&1; then
    echo "$name: installing $ds_spec into $venv (DS_BUILD_OPS=0: no op compiled)"
    # DeepSpeed's setup.py imports torch: build it against the venv's torch.
    if ! DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$venv/bin/pip" install --no-build-isolation \
        "$ds_spec" > "$venv/install-deepspeed.log" 2>&1; then
      ds_error="pip install $ds_spec failed (log: $venv/install-deepspeed.log)"
    elif ! DS_ACCELERATOR=cpu "$py" -c 'import deepspeed' > /dev/null 2>&1; then
      ds_error="deepspeed does not import: $(DS_ACCELERATOR=cpu "$py" -c 'import deepspeed' 2>&1 | tail -1)"
    fi
  fi
  if [[ -n "$ds_error" ]]; then
    echo "$name: DeepSpeed left out: $ds_error"
    frameworks="$(echo " $frameworks " | sed 's/ ds1 / /; s/ ds3 / /')"
  fi
fi
versions="$("$py" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
ds_version="$(DS_ACCELERATOR=cpu "$py" -c 'import deepspeed; print(deepspeed.__version__)' 2> /dev/null || echo none)"
echo "$name: torch/transformers $versions, deepspeed $ds_version ($venv)"

rm -rf "$raw"
mkdir -p "$raw/bin" "$(dirname "$out")"
cores="$(getconf _NPROCESSORS_ONLN)"  # not nproc: it honours OMP_NUM_THREADS, set below
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DS_ACCELERATOR=cpu

if [[ -z "$config" ]]; then
  config="$raw/config.json"
  cat > "$config" << EOF
{
  "architectures": ["GPT2LMHeadModel"],
  "model_type": "gpt2",
  "n_layer": $layers,
  "n_head": $heads,
  "n_embd": $width,
  "n_positions": $positions,
  "n_ctx": $positions,
  "vocab_size": $vocab,
  "layer_norm_epsilon": 1e-05,
  "activation_function": "gelu_new",
  "tie_word_embeddings": true,
  "resid_pdrop": 0.0,
  "embd_pdrop": 0.0,
  "attn_pdrop": 0.0
}
EOF
else
  cp "$config" "$raw/config.json"
fi

# zeroshard: a copy of the binary (a rebuild during the run cannot mix
# versions); mpirun with --backend mpi when it has one (one process per
# rank, as the peers), else its local backend (--ranks N in one process).
zs_launch=local
if has zeroshard; then
  cp "$gpt_train" "$raw/bin/"
  gpt_train="$raw/bin/gpt_train"
  if grep -q -a -- '--backend' "$gpt_train" && command -v mpirun > /dev/null; then
    zs_launch=mpi
  fi
fi
# The BLAS gpt_train's products run on, from the library it links (its
# output does not name it): OpenBLAS's config and core as it picks them in
# this environment, or the BLAS-like libraries ldd lists.
zs_blas="-"
if has zeroshard; then
  zs_blas="$(ldd "$gpt_train" | grep -o -E '/[^ ]*(blas|blis|mkl|dnnl)[^ ]*' | sort -u | tr '\n' ' ')"
  openblas="$(ldd "$gpt_train" | grep -o -E '/[^ ]*libopenblas[^ ]*' | head -1)"
  if [[ -n "$openblas" ]]; then
    zs_blas="$(python3 -c 'import ctypes, os, sys
l = ctypes.CDLL(sys.argv[1])
l.openblas_get_config.restype = l.openblas_get_corename.restype = ctypes.c_char_p
forced = os.environ.get("OPENBLAS_CORETYPE")
print("%s, core %s (%s)" % (l.openblas_get_config().decode(), l.openblas_get_corename().decode(),
      "OPENBLAS_CORETYPE=%s in the environment" % forced if forced else "detected"))' "$openblas" \
      2> /dev/null || echo "$zs_blas")"
  fi
fi
# shellcheck disable=SC2054  # "self,vader" is one argument
mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none)

"$py" "$root/perf/peers/gemm_peak.py" --json "$raw/gemm_peak.json"
lscpu > "$raw/lscpu.txt" 2>&1 || true
cat > "$raw/meta.json" << EOF
{"config": "$config", "data": "$data", "data_bytes": $(stat -c %s "$data"),
 "seq": $seq, "micro_batch": $micro_batch, "steps": $steps, "warmup": $warmup,
 "ranks": "$ranks", "precisions": "$precisions", "frameworks": "$frameworks",
 "zs_stages": "$zs_stages", "repeats": $repeats, "zs_launch": "$zs_launch",
 "nproc": $cores, "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "threads_per_rank": 1,
 "deepspeed_error": "$ds_error", "zeroshard_blas": "$zs_blas", "load_at_start": "$(cut -d' ' -f1-3 /proc/loadavg)"}
EOF
for n in $ranks; do
  if [[ $n -gt $cores ]]; then
    echo "$name: note: $cores cores: $n processes oversubscribe them (every framework alike)"
  fi
done

failed=" "  # runs (framework, precision, ranks) that failed once: not rerun

# zeroshard's run: its stdout in $1.txt (gpt_compare.py parses its summary:
# median step, the per-step split, final loss). gpt_train reads --data
# itself (its last 5% is its validation split, never read here) through its
# own sampler: the same bytes as the peers, other windows of them; a step's
# time does not depend on which windows it reads.
run_zs() {
  local base="$1" n="$2" stage="$3" prec="$4" key="zs${3}_${4}_r${2}"
  [[ "$failed" == *" $key "* ]] && return 0
  local flags=(--config "$config" --data "$data" --stage "$stage" --micro-batch "$micro_batch"
    --seq "$seq" --steps "$steps" --precision "$prec")
  if grep -q -a -- '--quiet' "$gpt_train"; then flags+=(--quiet); fi
  local cmd
  if [[ $zs_launch == mpi ]]; then
    cmd=(mpirun "${mpirun_flags[@]}" -np "$n" "$gpt_train" --backend mpi "${flags[@]}")
  else
    cmd=("$gpt_train" --ranks "$n" "${flags[@]}")
  fi
  echo "${cmd[*]}" > "$base.cmd"
  if ! timeout 1800 "${cmd[@]}" > "$base.txt" 2> "$base.err"; then
    echo "$name: zeroshard stage $stage $prec at $n failed (stdout $base.txt, stderr $base.err):" >&2
    tail -5 "$base.err" >&2
    tail -20 "$base.err" > "$base.fail"
    failed+="$key "
  fi
}

# A peer's launch: one torchrun per framework, rank count and repeat, one
# measurement per precision (torch_gpt.py makes a fresh model for each), and
# in the first repeat the instrumented (--split-json) ones after them: the
# start-up (imports, DeepSpeed's) is paid once per launch. Rank 0 writes
# {fw}_{prec}_r{n}_{k}.json and split_{fw}_{prec}_r{n}.json. A non-zero exit
# after every JSON was written is a gloo teardown abort: kept with a
# warning. A measurement whose JSON is missing gets a .fail file with
# stderr's tail; a framework that produced nothing is left out of the later
# repeats at that rank count.
run_peer() {
  local n="$1" fw="$2" k="$3" key="${2}_r${1}"
  [[ "$failed" == *" $key "* ]] && return 0
  local base="$raw/${fw}_r${n}_$k" precs expected=() prec
  precs="$(echo "$precisions" | tr ' ' ',')"
  local cmd=("$venv/bin/torchrun" --standalone --nproc-per-node "$n"
    "$root/perf/peers/torch_gpt.py" --framework "$fw" --config "$config" --data "$data"
    --micro-batch "$micro_batch" --seq "$seq" --steps "$steps" --warmup "$warmup"
    --precision "$precs" --threads 1 --json "$raw/${fw}_{prec}_r${n}_$k.json")
  for prec in $precisions; do expected+=("$raw/${fw}_${prec}_r${n}_$k"); done
  if [[ $do_split -eq 1 && $k -eq 1 ]]; then
    cmd+=(--split-json "$raw/split_${fw}_{prec}_r${n}.json")
    for prec in $precisions; do expected+=("$raw/split_${fw}_${prec}_r${n}"); done
  fi
  echo "${cmd[*]}" > "$base.cmd"
  local rc=0
  timeout 1800 "${cmd[@]}" > "$base.log" 2> "$base.err" || rc=$?
  local missing=0 got=0 e
  for e in "${expected[@]}"; do
    if [[ -s "$e.json" ]] && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$e.json"; then
      got=$((got + 1))
    else
      missing=$((missing + 1))
      grep -v '^W[0-9]' "$base.err" | tail -40 > "$e.fail"
    fi
  done
  if [[ $missing -eq 0 && $rc -ne 0 ]]; then
    echo "$name: warning: $fw at $n exited $rc after all measurements (teardown; $base.err)" >&2
  elif [[ $missing -gt 0 ]]; then
    echo "$name: $fw at $n process(es): $missing of ${#expected[@]} measurements missing, exit" \
      "$rc (stderr $base.err):" >&2
    grep -v '^W[0-9]' "$base.err" | grep -E 'Error|error|raise|not supported|NotImplemented' |
      tail -4 >&2 || true
    if [[ $got -eq 0 ]]; then failed+="$key "; fi
  fi
}

peer_of_stage=([0]=ddp [1]=ds1 [3]=ds3)
for ((k = 1; k <= repeats; k++)); do
  for n in $ranks; do
    echo "$name: repeat $k/$repeats: $n process(es) ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
    for stage in $zs_stages; do
      if has zeroshard; then
        for prec in $precisions; do
          run_zs "$raw/zs_s${stage}_${prec}_r${n}_$k" "$n" "$stage" "$prec"
        done
      fi
      peer="${peer_of_stage[$stage]:-}"
      if [[ -n "$peer" ]] && has "$peer"; then run_peer "$n" "$peer" "$k"; fi
    done
    for peer in ddp ds1 ds3; do  # peers whose zeroshard stage is not in --zs-stages
      stage_listed=0
      for stage in $zs_stages; do
        if [[ "${peer_of_stage[$stage]:-}" == "$peer" ]]; then stage_listed=1; fi
      done
      if [[ $stage_listed -eq 0 ]] && has "$peer"; then run_peer "$n" "$peer" "$k"; fi
    done
    if has fsdp2; then run_peer "$n" fsdp2 "$k"; fi
  done
done

# The peak again at the end (the machine is shared): the table takes the
# better of the two.
"$py" "$root/perf/peers/gemm_peak.py" --json "$raw/gemm_peak_end.json"
python3 "$root/perf/peers/gpt_compare.py" "$raw" "$out"
