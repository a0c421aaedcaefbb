# shellcheck shell=bash
# Shared by the scripts in tests/multinode. Source it after exporting
# ZS_MPI_TEST_ID (a tag every rank of the job carries in its environment).

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
