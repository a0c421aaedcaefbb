#!/usr/bin/env bash
# An emulated cluster on this machine: N "nodes", each a network + UTS + PID
# + mount namespace (its own hostname, its own /proc: a node cannot see
# another node's processes), joined by veth links to a bridge in a "head"
# namespace, where mpirun runs and reaches the nodes over TCP. Open MPI's rsh
# launcher starts its daemons on the nodes through this script's `agent`
# (nsenter into the node) instead of ssh; ranks on one node talk through
# shared memory, ranks on two nodes through TCP over the veth links. Nothing
# touches the machine's own network namespace: every link, address and
# qdisc lives in namespaces this script makes, and `down` removes them.
#
#   zs_cluster.sh up NODES [--rate RATE]   make the cluster (a stale one is
#                                          removed first); RATE shapes every
#                                          node's link with tbf, e.g. 1gbit
#   zs_cluster.sh down                     remove it (idempotent)
#   zs_cluster.sh exec NODE CMD...         run CMD on node NODE (0-based)
#   zs_cluster.sh head CMD...              run CMD in the head namespace
#   zs_cluster.sh mpirun RANKS_PER_NODE [MPIRUN ARGS...] -- PROGRAM ARGS...
#                                          mpirun across every node
#   zs_cluster.sh hosts RANKS_PER_NODE     the --host list mpirun gets
#   zs_cluster.sh node-of HOST             the node index of an address
#   zs_cluster.sh agent HOST CMD...        Open MPI's launcher agent (internal)
#   zs_cluster.sh counters                 bytes each node's link sent and
#                                          received: "nodeI tx BYTES rx BYTES"
#
# Needs root (ip netns, unshare, nsenter, tc from iproute2 and util-linux).
# docs/multinode.md says what it proves and what it cannot.
set -euo pipefail

ZS_CLUSTER=${ZS_CLUSTER:-zsc}           # name prefix of every namespace and link
STATE=/run/zs-cluster/$ZS_CLUSTER      # node pids, addresses
SUBNET=10.213.77                       # a private /24, only inside the head namespace
HEAD=$ZS_CLUSTER-head
SELF=$(readlink -f "$0")

die() {
  echo "zs_cluster: $*" >&2
  exit 1
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network, UTS, PID and mount namespaces); run as root"
  for tool in ip unshare nsenter tc; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian: iproute2, util-linux)"
  done
}

node_count() {
  [ -f "$STATE/nodes" ] || die "no cluster '$ZS_CLUSTER' is up (zs_cluster.sh up N first)"
  cat "$STATE/nodes"
}

node_pid() {  # the node's init process, in this machine's PID namespace
  local pid
  pid=$(cat "$STATE/node$1.pid" 2>/dev/null) || die "node $1 of cluster '$ZS_CLUSTER' does not exist"
  [ -d "/proc/$pid" ] || die "node $1's namespaces are gone (its init, pid $pid, exited)"
  echo "$pid"
}

node_addr() { echo "$SUBNET.$(($1 + 1))"; }

cmd_down() {
  # Every node's processes first (killing a PID namespace's init kills the
  # namespace), then the namespaces; the links go with them.
  if [ -d "$STATE" ]; then
    for f in "$STATE"/node*.pid; do
      [ -e "$f" ] || continue
      local pid
      pid=$(cat "$f")
      [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$ZS_CLUSTER-(head|node[0-9]+)$" || true); do
    # Any process left in it (a daemon started by hand) goes too.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$STATE"
}

cmd_up() {
  local nodes=$1 rate=""
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] ||
    die "up: NODES must be 1-64, got '$nodes'"
  need_root
  if [ -d "$STATE" ] || ip netns list 2>/dev/null | grep -q "^$HEAD\b"; then
    echo "zs_cluster: removing a stale cluster '$ZS_CLUSTER' (a killed run's)" >&2
    cmd_down
  fi
  mkdir -p "$STATE"
  ip netns add "$HEAD" || die "ip netns add $HEAD failed: this machine does not allow network namespaces"
  ip -n "$HEAD" link set lo up
  ip -n "$HEAD" link add br0 type bridge || die "cannot make a bridge in $HEAD"
  ip -n "$HEAD" addr add "$SUBNET.254/24" dev br0
  ip -n "$HEAD" link set br0 up
  local i
  for ((i = 0; i < nodes; i++)); do
    local ns=$ZS_CLUSTER-node$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The node's end is eth0; the head's end, n<i>, is a port of the bridge.
    ip link add "$ZS_CLUSTER-n$i" netns "$HEAD" type veth peer name eth0 netns "$ns" ||
      die "cannot make a veth link for node $i"
    ip -n "$HEAD" link set "$ZS_CLUSTER-n$i" master br0 up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$rate" ]; then
      # The node's link at RATE each way: the node's egress on eth0, its
      # ingress as the head port's egress.
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms ||
        die "tc tbf on node $i failed (rate '$rate')"
      ip netns exec "$HEAD" tc qdisc add dev "$ZS_CLUSTER-n$i" root tbf rate "$rate" burst 256kb latency 100ms
    fi
    # The node's init: its own UTS (hostname), PID and mount namespaces
    # with its own /proc. ip netns exec execs unshare, so $! is unshare's
    # pid; the init is its child.
    ip netns exec "$ns" unshare --uts --pid --mount --fork --mount-proc \
      bash -c "hostname $ns; trap 'exit 0' TERM; while :; do sleep 3600 & wait \$!; done" \
      </dev/null >/dev/null 2>&1 &
    local unshare_pid=$! init=""
    for _ in $(seq 100); do
      init=$(pgrep -P "$unshare_pid" | head -1 || true)
      [ -n "$init" ] && [ "$(readlink "/proc/$init/ns/uts")" != "$(readlink /proc/self/ns/uts)" ] && break
      init=""
      sleep 0.05
    done
    [ -n "$init" ] || die "node $i's namespaces did not come up (unshare --uts --pid --mount refused?)"
    echo "$init" >"$STATE/node$i.pid"
  done
  echo "$nodes" >"$STATE/nodes"
  echo "${rate:-unshaped}" >"$STATE/rate"
  # Every link is up at both ends (no ping here: Debian's base has none).
  for ((i = 0; i < nodes; i++)); do
    for _ in $(seq 50); do
      ip -n "$ZS_CLUSTER-node$i" link show eth0 | grep -q LOWER_UP && break
      sleep 0.1
    done
    ip -n "$ZS_CLUSTER-node$i" link show eth0 | grep -q LOWER_UP ||
      die "node $i's link (eth0, $(node_addr "$i")) did not come up"
  done
  echo "zs_cluster: $nodes node(s) up ($SUBNET.1-$nodes, link ${rate:-unshaped}), head $HEAD" >&2
}

cmd_exec() {
  local node=$1
  shift
  local pid
  pid=$(node_pid "$node")
  exec nsenter -t "$pid" --net --uts --pid --mount -- "$@"
}

cmd_agent() {
  # Open MPI's rsh launcher calls: agent HOST CMD... where CMD is meant for a
  # remote shell (one string, or words a shell joins).
  local host=$1
  shift
  local node
  node=$(cmd_node_of "$host")
  local pid
  pid=$(node_pid "$node")
  # As ssh with keepalives (-o ServerAliveInterval=1 -o ServerAliveCountMax=N)
  # talking to an sshd with ClientAlive: the agent probes the node over the
  # network every second; after $ZS_CLUSTER_ALIVE_MAX failed probes in a row
  # (default 8) it ends the node's side of the session, as sshd would once
  # its client stopped answering, and exits 255, as ssh does ("Timeout,
  # server not responding"), so that mpirun learns its daemon there is lost.
  # Without it a node whose link went down would keep mpirun waiting for
  # good: nothing else tells it.
  nsenter -t "$pid" --net --uts --pid --mount -- /bin/sh -c "$*" <&0 &
  local session=$!
  # Ended by mpirun or by the keepalive: hang up the node's side, as sshd
  # does when its client goes away, and exit as ssh does then.
  # shellcheck disable=SC2064
  trap "kill -HUP \$(descendants $session) $session 2>/dev/null; exit 255" TERM HUP INT
  keepalive "$node" "$session" &
  local watcher=$!
  local rc=0
  wait "$session" || rc=$?
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null || true
  exit "$rc"
}

# Every descendant of a process, deepest first.
descendants() {
  local child
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    descendants "$child"
    echo "$child"
  done
}

# The keepalive of one agent: probes node $1 (a TCP connect to a closed
# port: "connection refused" is an answer, a timeout or "no route" is not)
# and, when the node stays silent, closes this namespace's TCP connections
# to it and ends the session $2.
keepalive() {
  local node=$1 session=$2 addr
  local limit=${ZS_CLUSTER_ALIVE_MAX:-8}
  addr=$(node_addr "$node")
  local last_answer now answer
  last_answer=$(date +%s%N)
  while kill -0 "$session" 2>/dev/null; do
    sleep 0.5
    answer=$(timeout 1 bash -c "exec 3<>/dev/tcp/$addr/1" 2>&1) || true
    now=$(date +%s%N)
    [[ $answer == *refused* ]] && last_answer=$now
    if (((now - last_answer) / 1000000000 >= limit)); then
      echo "zs_cluster agent: node $node ($addr) has not answered for $limit s (its link is down or it is gone): ending the session there and exiting 255, as ssh -o ServerAliveCountMax=$limit would" >&2
      # mpirun's own connection to the daemon there would wait out TCP's
      # retransmissions (about 15 minutes) before it failed: fail it now,
      # as TCP would once it gave up (needs CONFIG_INET_DIAG_DESTROY).
      ss -K dst "$addr" >/dev/null 2>&1 || true
      # shellcheck disable=SC2046
      kill -KILL $(descendants "$session") "$session" 2>/dev/null
      # The agent itself: its wait returns and it exits 255.
      kill -TERM "$$" 2>/dev/null
      exit 0
    fi
  done
}

cmd_node_of() {
  local host=$1 n
  n=$(node_count)
  local i
  for ((i = 0; i < n; i++)); do
    if [ "$host" = "$(node_addr "$i")" ] || [ "$host" = "$ZS_CLUSTER-node$i" ]; then
      echo "$i"
      return
    fi
  done
  die "agent: '$host' is no node of cluster '$ZS_CLUSTER'"
}

cmd_hosts() {
  local per=$1 n i list=""
  n=$(node_count)
  for ((i = 0; i < n; i++)); do list+="${list:+,}$(node_addr "$i"):$per"; done
  echo "$list"
}

cmd_mpirun() {
  local per=$1
  shift
  local extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra+=("$1")
    shift
  done
  [ "${1:-}" = "--" ] || die "mpirun: put -- before the program"
  shift
  local n
  n=$(node_count)
  # The daemons dial back to mpirun over the bridge; ranks of two nodes use
  # TCP over eth0, ranks of one node shared memory (vader). Each daemon
  # stays attached to its agent's session (--leave-session-attached: no
  # --daemonize), so that an agent whose keepalive gave up on its node ends
  # the daemon there and tells mpirun, as an ssh session would.
  exec ip netns exec "$HEAD" mpirun --allow-run-as-root --leave-session-attached \
    --host "$(cmd_hosts "$per")" -np $((n * per)) \
    --mca plm_rsh_agent "$SELF agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
    "${extra[@]}" "$@"
}

cmd_counters() {
  local n i
  n=$(node_count)
  for ((i = 0; i < n; i++)); do
    local pid
    pid=$(node_pid "$i")
    # /proc/net/dev is the reader's network namespace (sysfs would be the
    # mounter's): rx bytes in field 2, tx bytes in field 10.
    nsenter -t "$pid" --net cat /proc/net/dev |
      awk -v node="node$i" '$1 == "eth0:" { print node, "tx", $10, "rx", $2 }'
  done
}

[ $# -ge 1 ] || die "usage: zs_cluster.sh up|down|exec|head|mpirun|hosts|counters ... (see the header)"
verb=$1
shift
case $verb in
  up) [ $# -ge 1 ] || die "usage: zs_cluster.sh up NODES [--rate RATE]"; cmd_up "$@" ;;
  down) need_root; cmd_down ;;
  exec) [ $# -ge 2 ] || die "usage: zs_cluster.sh exec NODE CMD..."; cmd_exec "$@" ;;
  head) [ $# -ge 1 ] || die "usage: zs_cluster.sh head CMD..."; exec ip netns exec "$HEAD" "$@" ;;
  agent) [ $# -ge 2 ] || die "usage: zs_cluster.sh agent HOST CMD..."; cmd_agent "$@" ;;
  node-of) cmd_node_of "$1" ;;
  hosts) cmd_hosts "$1" ;;
  mpirun) [ $# -ge 1 ] || die "usage: zs_cluster.sh mpirun RANKS_PER_NODE [ARGS] -- PROGRAM..."; cmd_mpirun "$@" ;;
  counters) cmd_counters ;;
  *) die "unknown verb '$verb' (up, down, exec, head, mpirun, hosts, counters)" ;;
esac
