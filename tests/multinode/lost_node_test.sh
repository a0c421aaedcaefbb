#!/usr/bin/env bash
# A lost node ends the job: on the emulated cluster (2 nodes x 2 ranks),
# node 1's ranks are SIGKILLed, SIGSTOPped, or node 1's link goes down
# (`ip link set eth0 down` inside the node) while mlp_demo trains; the job
# must end within the communicator timeout + 5 s, mpirun non-zero, with a
# message naming a rank of node 1 and the node, and leave no rank behind.
# A stopped or cut-off node must be named by the heartbeats (before the
# timeout), a killed one by Open MPI's launcher or the heartbeats. Nothing
# may be left on any node: ranks, daemons, shells (node_leftovers).
# In ctest (multinode_lost_node) once per fault; docs/multinode.md quotes 5.
# DEMO_ARG...: more mlp_demo flags (multinode_lost_node_qgz: ZeRO++ with
# qgZ, whose transfers are Sends and Recvs, watched by the heartbeats too).
#
#   lost_node_test.sh MLP_DEMO FAULT[,FAULT...] [RUNS [DEMO_ARG...]]
#   FAULT: KILL, STOP, LINK
set -uo pipefail
demo=$1
faults=$2
runs=${3:-1}
shift $(($# < 3 ? $# : 3))
demo_args=("$@")
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/zs_cluster.sh
timeout_s=10
limit_ms=$(((timeout_s + 5) * 1000))

# shellcheck source=tests/multinode/multinode_lib.sh
source "$here/multinode_lib.sh"

# Node 1's ranks, as this machine's pids: processes in node 1's UTS
# namespace that carry the id and a rank number (not orted or its shell).
node1_ranks() {
  local pid
  for pid in $(our_ranks); do
    [ "$(readlink "/proc/$pid/ns/uts" 2>/dev/null)" = "$node1_uts" ] || continue
    tr "\\0" "\\n" 2>/dev/null <"/proc/$pid/environ" | grep -q "^OMPI_COMM_WORLD_RANK=" &&
      echo "$pid"
  done
}

fault=""
run=0
fail() {
  echo "FAIL ($fault, run $run): $*"
  echo "---- job output ----"
  cat "$work/out" 2>/dev/null
  exit 1
}

multinode_begin zsl zs-lost-node
"$cluster" up 2 2>"$work/up.out" || fail "zs_cluster.sh up 2 failed: $(cat "$work/up.out")"
node1_uts=$(readlink "/proc/$(cat "/run/zs-cluster/$ZS_CLUSTER/node1.pid")/ns/uts")

for fault in ${faults//,/ }; do
  times=()
  for ((run = 1; run <= runs; run++)); do
    export ZS_MPI_TEST_ID="zs-lost-node-$$-$fault-$run"
    "$cluster" mpirun 2 -- "$demo" --backend mpi --steps 1000000 --comm-timeout "$timeout_s" \
      "${demo_args[@]}" >"$work/out" 2>&1 &
    launcher=$!
    victims=""
    for _ in $(seq 600); do
      victims=$(node1_ranks)
      [ "$(echo "$victims" | grep -c .)" = 2 ] && break
      kill -0 "$launcher" 2>/dev/null || fail "the job ended before node 1's ranks ran"
      sleep 0.1
    done
    [ "$(echo "$victims" | grep -c .)" = 2 ] || fail "node 1's 2 ranks did not start within 60 s"
    sleep 3  # training under way
    kill -0 "$launcher" 2>/dev/null || fail "the job ended before the fault"
    start=$(now_ms)
    # shellcheck disable=SC2086  # $victims: one pid per word
    case $fault in
      KILL) kill -KILL $victims ;;
      STOP) kill -STOP $victims ;;
      LINK) "$cluster" exec 1 ip link set eth0 down ;;
      *) fail "unknown fault '$fault' (KILL, STOP, LINK)" ;;
    esac
    rc=""
    while [ -z "$rc" ]; do
      if ! kill -0 "$launcher" 2>/dev/null; then
        wait "$launcher"
        rc=$?
      elif (($(now_ms) - start > 60000)); then
        fail "mpirun still running 60 s after the fault"
      else
        sleep 0.05
      fi
    done
    elapsed=$(($(now_ms) - start))
    echo "$fault of node 1, run $run: mpirun exited $rc after $((elapsed / 1000)).$(printf %03d $((elapsed % 1000))) s"
    grep -m1 -o "mlp_demo: run failed: .\{0,160\}" "$work/out" | sed 's/^/  /'
    [ "$rc" != 0 ] || fail "mpirun exited 0"
    ((elapsed <= limit_ms)) || fail "took $elapsed ms, more than the timeout + 5 s"
    # The engine's message, or (a killed rank) Open MPI's launcher, which
    # tears the job down first and names the rank and the node's address.
    grep -Eq "mlp_demo: run failed: .*(rank [23] \\(|\\(world rank [23], )pid [0-9]+ on $ZS_CLUSTER-node1\\)" "$work/out" ||
      grep -Eq "process rank [23] with PID [0-9]+ on node $("$cluster" hosts 1 | cut -d, -f2 | cut -d: -f1)" "$work/out" ||
      fail "no message naming rank 2 or 3 on $ZS_CLUSTER-node1"
    # A stopped or unreachable node: the heartbeats named it, not the timeout.
    if [ "$fault" != KILL ]; then
      grep -q "has sent no heartbeat for" "$work/out" || fail "the heartbeats did not name the lost ranks"
    fi
    # Give the daemons and shells a few seconds to go, as on real nodes.
    for _ in $(seq 50); do
      [ -z "$(our_ranks)$(node_leftovers)" ] && break
      sleep 0.1
    done
    left=$(our_ranks)
    [ -z "$left" ] || fail "processes left after mpirun exited: $left"
    left=$(node_leftovers)
    [ -z "$left" ] || fail "processes left on the nodes 5 s after mpirun exited: $left"
    times+=("$elapsed")
    [ "$fault" = LINK ] && "$cluster" exec 1 ip link set eth0 up
  done
  echo "PASS: $fault, $runs run(s), ms: ${times[*]}"
done
echo "PASS"
