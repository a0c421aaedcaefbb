#!/usr/bin/env bash
# Hierarchical collectives bitwise equal to the flat ones, on the emulated
# cluster (zs_cluster.sh): 2 nodes x 2 ranks, then 4 nodes x 1 rank.
# hierarchical_collectives_test.cc says what each run checks.
#
#   hierarchical_collectives_test.sh TEST_BINARY
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/zs_cluster.sh
FAIL_TAIL=60
# shellcheck source=tests/multinode/multinode_lib.sh
source "$here/multinode_lib.sh"
multinode_begin zsh zs-hierarchical

for shape in "2 2" "4 1"; do
  read -r nodes per_node <<<"$shape"
  "$cluster" up "$nodes" 2>"$work/up.out" || fail "zs_cluster.sh up $nodes failed: $(cat "$work/up.out")"
  start=$(date +%s)
  timeout -k 5 240 "$cluster" mpirun "$per_node" -x ZS_MPI_TEST_ID -x ZS_TEST_SEED -- \
    "$bin" "$nodes" "$per_node" >"$work/run.out" 2>&1
  rc=$?
  grep -E "^(test seed|hierarchical:|large all-gathers|PASS|FAIL|rank [0-9]+: FAIL)" "$work/run.out"
  [ "$rc" = 0 ] || fail "$nodes nodes x $per_node ranks: exit status $rc"
  grep -q "^PASS: $nodes nodes x $per_node ranks" "$work/run.out" || fail "$nodes x $per_node: no PASS line"
  echo "$nodes nodes x $per_node ranks: $(($(date +%s) - start)) s"
  "$cluster" down
done
ip netns list | grep -q "^$ZS_CLUSTER-" && fail "namespaces left after down: $(ip netns list | grep "^$ZS_CLUSTER-")"
left=$(our_ranks)
[ -z "$left" ] || fail "processes left after the runs: $left"
echo "PASS"
