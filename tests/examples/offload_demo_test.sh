#!/usr/bin/env bash
# mlp_demo and gpt_train with the optimizer state offloaded (--offload,
# docs/offload.md), as a user runs them:
#  - mlp_demo on 2 ranks, ZeRO stage 2, fp32: optimizer=host and =nvme (small
#    chunks, several per unit) give the no-offload run's losses and final
#    weights bit for bit; each tier's ledger equals its plan, and the device
#    bytes drop by exactly the state's bytes (what the nvme tier's plan holds);
#  - mlp_demo bf16 at stage 1 with optimizer=nvme and no --offload-dir: the
#    same bits, and the scratch directory is gone at the end;
#  - mlp_demo at stage 3 with optimizer=host,grads=host,params=host: the same
#    bits as stage 3 without offload;
#  - gpt_train with optimizer=host: the no-offload run's losses bit for bit,
#    and the per-tier table printed;
#  - bad flags end with exit 2 and one line naming the flag.
# usage: offload_demo_test.sh MLP_DEMO GPT_TRAIN TEXT
set -euo pipefail
demo=$1 gpt=$2 text=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Fresh data and initial weights per run of the test (the seed flags of the
# MLP are fixed: its --hidden varies instead).
hidden=$((32 + 8 * (RANDOM % 5)))
mlp=(--ranks 2 --steps 6 --hidden "$hidden" --blocks 2 --micro-batch 8)
echo "mlp_demo ${mlp[*]}"

run_demo() {  # name, flags...
  local name=$1; shift
  "$demo" "${mlp[@]}" "$@" --result-json "$work/$name.json" >"$work/$name.out" 2>"$work/$name.err" ||
    fail "mlp_demo $*: $(tail -5 "$work/$name.err")"
}
# compare BASE OFFLOADED SWAP_DIR_OR_EMPTY: the checks above, in Python.
compare() {
  python3 - "$work/$1.json" "$work/$2.json" ${3:-} <<'PY' || fail "$2 vs $1"
import json, sys
base, off = (json.load(open(p)) for p in sys.argv[1:3])
def die(msg):
    print(f"{sys.argv[2]}: {msg}"); sys.exit(1)
if base["losses"] != off["losses"]:
    die(f"losses differ: {base['losses']} vs {off['losses']}")
if base["weights_fnv1a64"] != off["weights_fnv1a64"]:
    die(f"final weights differ (fingerprints {base['weights_fnv1a64']} vs {off['weights_fnv1a64']})")
for run in (base, off):
    for tier, b in run["tiers_rank0"].items():
        if b["plan"] != b["ledger"]:
            die(f"{run['offload']} run, {tier} tier: ledger {b['ledger']} != plan {b['plan']}")
bt, ot = base["tiers_rank0"], off["tiers_rank0"]
drop = bt["device"]["ledger"] - ot["device"]["ledger"]
if drop <= 0 or drop != bt["device"]["plan"] - ot["device"]["plan"]:
    die(f"device bytes dropped by {drop}, the plan says {bt['device']['plan'] - ot['device']['plan']}")
if off["device_plan_without_offload"] != bt["device"]["plan"]:
    die(f"device plan without offload {off['device_plan_without_offload']} != the base run's {bt['device']['plan']}")
# With only the optimizer state on NVMe the device drops exactly what the
# files hold; with the param shards there too, the device also gains their
# staging buffers, so it drops less.
params_nvme = len(sys.argv) > 3 and sys.argv[3] == "params_nvme"
if off["offload"] == "nvme" and not params_nvme and drop != ot["nvme"]["plan"]:
    die(f"the device dropped {drop} bytes but the nvme tier holds {ot['nvme']['plan']}")
if params_nvme and not 0 < drop < ot["nvme"]["plan"]:
    die(f"params on nvme: the device dropped {drop} bytes, the nvme tier holds {ot['nvme']['plan']}")
if off["offload"] == "host" and ot["host"]["plan"] <= drop:
    die(f"the host tier holds {ot['host']['plan']} bytes, not more than the {drop} the device dropped")
print(f"{off['offload']}: {len(off['losses'])} losses and weights {off['weights_fnv1a64']} equal; device -{drop} bytes")
PY
}

run_demo base --stage 2
run_demo host --stage 2 --offload optimizer=host
mkdir "$work/swap"
run_demo nvme --stage 2 --offload optimizer=nvme --offload-dir "$work/swap" --offload-chunk 4096
compare base host
compare base nvme
grep -q "memory per tier" "$work/nvme.out" || fail "no per-tier table: $(cat "$work/nvme.out")"
[ -z "$(ls -A "$work/swap")" ] || fail "swap files left in --offload-dir: $(ls "$work/swap")"

# bf16, stage 1, the default scratch directory: made and removed.
swap_dirs() { find /tmp -maxdepth 1 -name 'zs_mlp_demo_swap_*' | wc -l; }
before=$(swap_dirs)
run_demo base16 --stage 1 --precision bf16
run_demo nvme16 --stage 1 --precision bf16 --offload optimizer=nvme --offload-chunk 8192
compare base16 nvme16
after=$(swap_dirs)
[ "$before" = "$after" ] || fail "the default swap directory was not removed ($before before, $after after)"

# Stage 3 with the gradient shard and the param shards on the host too.
run_demo base3 --stage 3
run_demo host3 --stage 3 --offload optimizer=host,grads=host,params=host
compare base3 host3
# And the param shards on NVMe beside the state.
run_demo nvme3 --stage 3 --offload optimizer=nvme,params=nvme --offload-dir "$work/swap"
compare base3 nvme3 params_nvme

# gpt_train, host tier against the device.
cat >"$work/config.json" <<'JSON'
{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_head": 2,
 "n_embd": 32, "n_positions": 32, "vocab_size": 256, "layer_norm_epsilon": 1e-5,
 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
JSON
gcommon=(--config "$work/config.json" --data "$text" --seq 16 --micro-batch 2 --steps 4 --quiet
         --ranks 2 --stage 2 --seed $((RANDOM + 1)))
losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
"$gpt" "${gcommon[@]}" --log-json "$work/g0.jsonl" >"$work/g0.out" || fail "gpt_train (device)"
"$gpt" "${gcommon[@]}" --offload optimizer=host --log-json "$work/g1.jsonl" >"$work/g1.out" ||
  fail "gpt_train --offload optimizer=host"
[ "$(losses "$work/g0.jsonl" | wc -l)" = 4 ] || fail "gpt_train logged $(wc -l <"$work/g0.jsonl") steps, not 4"
diff <(losses "$work/g0.jsonl") <(losses "$work/g1.jsonl") || fail "gpt_train: host tier losses differ"
grep -q "memory per tier" "$work/g1.out" || fail "gpt_train: no per-tier table: $(cat "$work/g1.out")"
grep -q "(ledger != plan)" "$work/g1.out" && fail "gpt_train: ledger != plan: $(cat "$work/g1.out")"

# Bad flags: exit 2, one line naming the flag.
expect_usage_error() {  # program, pattern, flags...
  local prog=$1 pattern=$2; shift 2
  set +e; "$prog" "$@" >"$work/bad.out" 2>"$work/bad.err"; local rc=$?; set -e
  [ "$rc" = 2 ] || fail "$prog $*: exit $rc, not 2"
  grep -q -- "$pattern" "$work/bad.err" || fail "$prog $*: '$(cat "$work/bad.err")' does not say $pattern"
}
expect_usage_error "$demo" "--offload optimizer" --offload optimizer=disk
expect_usage_error "$demo" "offload.grads host needs" --offload grads=host
expect_usage_error "$demo" "offload.params host needs zero_stage 3" --stage 2 --offload optimizer=host,params=host
expect_usage_error "$demo" "offload.params nvme needs zero_stage 3" --stage 2 --offload optimizer=nvme,params=nvme
expect_usage_error "$demo" "--offload params: 'disk'" --offload optimizer=nvme,params=disk
expect_usage_error "$demo" "--offload-dir" --offload-dir "$work"
expect_usage_error "$demo" "--offload-chunk" --offload optimizer=host --offload-chunk 1000
expect_usage_error "$demo" "--offload runs on the data-parallel" --offload optimizer=host --tp 2
expect_usage_error "$gpt" "--offload optimizer" --config "$work/config.json" --offload optimizer=gpu
echo "PASS"
