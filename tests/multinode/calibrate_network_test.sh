#!/usr/bin/env bash
# `zeroshard calibrate --what network` on the emulated cluster with its
# inter-node links shaped to 1 Gbit/s (tbf): the inter-node beta must come
# out near 0.125 GB/s and far below the intra-node one (shared memory), and
# `zeroshard estimate --network` must plan with them: a stage-1 step of
# llama-2-7b over 2 nodes is slower than with the defaults (45 GB/s).
#
#   calibrate_network_test.sh ZEROSHARD ZEROSHARD_CALIBRATE
set -uo pipefail
zeroshard=$1
calibrate=$2
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/zs_cluster.sh
FAIL_TAIL=30
# shellcheck source=tests/multinode/multinode_lib.sh
source "$here/multinode_lib.sh"
multinode_begin zsn zs-calibrate-network

# Without MPI the network cannot be measured: a clear refusal.
"$calibrate" --what network --out "$work/m.json" >"$work/local.out" 2>&1
[ $? = 2 ] || fail "--what network without --backend mpi did not exit 2"
grep -q "run it with --backend mpi under mpirun" "$work/local.out" || fail "no hint to use mpirun"

"$calibrate" --what compute --min-seconds 0.05 --out "$work/m.json" >"$work/compute.out" 2>&1 ||
  fail "calibrate --what compute failed"
"$cluster" up 2 --rate 1gbit 2>"$work/up.out" || fail "zs_cluster.sh up 2 --rate 1gbit: $(cat "$work/up.out")"
timeout -k 5 120 "$cluster" mpirun 2 -x ZS_MPI_TEST_ID -- \
  "$calibrate" --backend mpi --what network --out "$work/m.json" >"$work/network.out" 2>&1 ||
  fail "calibrate --what network under mpirun failed"
grep "calibrate:   i" "$work/network.out"
read -r intra inter < <(python3 - "$work/m.json" <<'PY'
import json, sys
n = json.load(open(sys.argv[1]))["network"]
assert n["nodes"] == 2 and n["ranks_per_node"] == 2, n
print(n["intra_node"]["beta_gbps"], n["inter_node"]["beta_gbps"])
PY
) || fail "the profile has no network section for 2 nodes x 2 ranks"
# tbf at 1gbit: 0.125 GB/s of payload plus TCP/IP headers, and the bucket's
# burst lets the first bytes of a message through at once.
awk -v b="$inter" 'BEGIN { exit !(b > 0.09 && b < 0.16) }' ||
  fail "inter-node beta $inter GB/s, not near the link's 0.125"
awk -v a="$intra" -v b="$inter" 'BEGIN { exit !(a > 10 * b) }' ||
  fail "intra-node beta $intra GB/s not above 10x the inter-node $inter"

plan() { "$zeroshard" estimate --preset llama-2-7b --gpus 16 --gpus-per-node 8 --stage 1 "$@"; }
plan --network "$work/m.json" >"$work/estimate.out" 2>&1 || fail "estimate --network failed"
grep -q "^network   intra-node .* GB/s, .* us; inter-node 0\.[0-9]* GB/s" "$work/estimate.out" ||
  fail "estimate did not report the measured links"
with=$(awk '$1 == "*" { print $NF }' "$work/estimate.out")
without=$(plan | awk '$1 == "*" { print $NF }')
awk -v a="$with" -v b="$without" 'BEGIN { exit !(a > 10 * b) }' ||
  fail "a 1 Gbit/s inter-node link did not slow the planned step ($with s vs $without s)"
echo "inter-node beta $inter GB/s, intra-node $intra GB/s; planned step $with s (defaults: $without s)"
plan --network "$work/m.json" --inter-node-bw 3 >"$work/conflict.out" 2>&1
[ $? = 2 ] && grep -q "both set the inter-node link" "$work/conflict.out" ||
  fail "--network with --inter-node-bw was not refused"
echo "PASS"
