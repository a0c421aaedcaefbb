# shellcheck shell=bash
# Shared by the scripts in tests/multinode. A test sets `cluster` (the path
# of zs_cluster.sh), sources this file and calls multinode_begin; the rank
# helpers need ZS_MPI_TEST_ID (a tag every rank of the job carries in its
# environment), which multinode_begin exports.

# The common start of a cluster test: a cluster name and a job id unique to
# this run (tests may run side by side), a work directory `work`, cleanup at
# exit (the cluster down, the job's ranks killed, even stopped ones, the
# work directory removed), and the root check (fail() says why).
#   multinode_begin CLUSTER_PREFIX JOB_ID_PREFIX
multinode_begin() {
  export ZS_CLUSTER="$1$$"
  export ZS_MPI_TEST_ID="$2-$$-$RANDOM"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  work=$(mktemp -d)
  trap multinode_cleanup EXIT
  [ "$(id -u)" = 0 ] ||
    fail "needs root to make network, UTS, PID and mount namespaces (CI runs as root)"
}

# shellcheck disable=SC2154  # `cluster`: set by the sourcing test
multinode_cleanup() {
  "$cluster" down 2>/dev/null
  for pid in $(our_ranks); do kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$work"
}

# Prints the failure and the last FAIL_TAIL (default 40) lines of every
# $work/*.out, then exits 1. A test may define its own after sourcing.
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -"${FAIL_TAIL:-40}" "$f"; }; done
  exit 1
}

# Pids (this machine's) of every process that carries $ZS_MPI_TEST_ID.
our_ranks() {
  local environ
  for environ in /proc/[0-9]*/environ; do
    tr "\\0" "\\n" 2>/dev/null <"$environ" | grep -qx "ZS_MPI_TEST_ID=$ZS_MPI_TEST_ID" &&
      basename "$(dirname "$environ")"
  done
}

now_ms() { date +%s%3N; }

# Pids (this machine's) of every process left on the nodes of cluster
# $ZS_CLUSTER besides each node's init and its sleep: daemons, ranks, shells.
node_leftovers() {
  local state=/run/zs-cluster/$ZS_CLUSTER init ns pid
  for init in $(cat "$state"/node*.pid 2>/dev/null); do
    ns=$(readlink "/proc/$init/ns/pid" 2>/dev/null) || continue
    for pid in /proc/[0-9]*; do
      pid=${pid#/proc/}
      [ "$pid" = "$init" ] && continue
      [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$ns" ] || continue
      # The init's own sleep (its idle loop).
      [ "$(cut -d' ' -f4 "/proc/$pid/stat" 2>/dev/null)" = "$init" ] &&
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ] && continue
      echo "$pid($(cat "/proc/$pid/comm" 2>/dev/null))"
    done
  done
}
