#!/usr/bin/env bash
# A stuck or dead rank ends a 4-process MPI run within the communicator
# timeout + 5 s, with a non-zero exit and the engine's message naming it.
#
#   mpi_fault_test.sh MPIEXEC DEMO STOP|KILL [default|report-first]
#
# Starts `mlp_demo --backend mpi` on 4 processes with --comm-timeout 10,
# waits until it trains, sends SIGSTOP or SIGKILL to rank 2 and checks how
# the job ends. `report-first` runs mpirun with
# `--mca orte_abort_on_non_zero_status 0`: OpenMPI's launcher then leaves a
# dead process to the engine, whose message comes first. By default OpenMPI
# tears the job down itself when a process dies, prints its own notice and
# holds the ranks' output until it is done (docs/communicator.md).
set -u
mpiexec=$1
demo=$2
signal=$3
mode=${4:-default}
timeout_s=10
limit_s=$((timeout_s + 5))
work=$(mktemp -d)
id="zs-fault-$$-$RANDOM"
export ZS_FAULT_TEST_ID=$id
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

fail() {
  echo "FAIL ($signal, $mode): $*"
  echo "---- job output ----"
  cat "$work/out"
  exit 1
}

# Pids of this test's ranks, "rank:pid" per line.
our_ranks() {
  local environ rank
  for environ in /proc/[0-9]*/environ; do
    [ -r "$environ" ] || continue
    tr "\\0" "\\n" 2>/dev/null <"$environ" | grep -qx "ZS_FAULT_TEST_ID=$id" || continue
    rank=$(tr "\\0" "\\n" 2>/dev/null <"$environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] && echo "$rank:$(basename "$(dirname "$environ")")"
  done
}

cleanup() {
  local entry
  for entry in $(our_ranks); do kill -CONT "${entry#*:}" 2>/dev/null; kill -KILL "${entry#*:}" 2>/dev/null; done
  [ -n "${launcher:-}" ] && kill -KILL "$launcher" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

extra=()
[ "$mode" = report-first ] && extra=(--mca orte_abort_on_non_zero_status 0)
"$mpiexec" --allow-run-as-root --oversubscribe --mca btl self,vader \
  --mca btl_vader_single_copy_mechanism none "${extra[@]}" -np 4 \
  "$demo" --backend mpi --steps 1000000 --comm-timeout "$timeout_s" >"$work/out" 2>&1 &
launcher=$!

# Wait for the four ranks, then for training to be under way.
pid=""
for _ in $(seq 1 600); do
  ranks=$(our_ranks)
  if [ "$(echo "$ranks" | grep -c :)" = 4 ]; then
    pid=$(echo "$ranks" | sed -n 's/^2://p')
    break
  fi
  kill -0 "$launcher" 2>/dev/null || fail "the job ended before all 4 ranks started"
  sleep 0.1
done
[ -n "$pid" ] || fail "rank 2 did not start within 60 s"
sleep 3
kill -0 "$launcher" 2>/dev/null || fail "the job ended before the fault was injected"

start_ms=$(($(date +%s%N) / 1000000))
kill "-$signal" "$pid" || fail "could not send SIG$signal to rank 2 (pid $pid)"
ended=""
for _ in $(seq 1 600); do
  if ! kill -0 "$launcher" 2>/dev/null; then
    ended=yes
    break
  fi
  sleep 0.1
done
[ -n "$ended" ] || fail "the job was still running 60 s after SIG$signal of rank 2"
wait "$launcher"
rc=$?
launcher=""
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
elapsed=$(printf "%d.%03d" $((elapsed_ms / 1000)) $((elapsed_ms % 1000)))

echo "SIG$signal of rank 2 (pid $pid), $mode launcher: the job ended in ${elapsed} s with exit status $rc"
[ "$rc" != 0 ] || fail "mpirun exited 0"
((elapsed_ms <= limit_s * 1000)) || fail "took ${elapsed} s, more than the timeout + 5 s = ${limit_s} s"

case $signal in
  STOP) state="is stopped" ;;
  KILL)
    state="died"
    # A dead peer on this machine is seen at once, not at the timeout.
    ((elapsed_ms < timeout_s * 1000 / 2)) ||
      fail "a dead rank took ${elapsed} s to end the job; it should not wait for the ${timeout_s} s timeout"
    ;;
  *) fail "unknown signal $signal" ;;
esac
pattern="rank 2 \\(pid $pid on [^)]*\\) $state"
grep -Eq "^mlp_demo: run failed: .*$pattern" "$work/out" ||
  fail "no engine message saying that rank 2 (pid $pid) $state"
first=$(grep -v '^[[:space:]]*$' "$work/out" | head -n 1)
echo "first line of the job's output: $first"
if [ "$signal" = STOP ] || [ "$mode" = report-first ]; then
  echo "$first" | grep -Eq "^mlp_demo: run failed: .*$pattern" ||
    fail "the engine's message is not the first line of the job's output"
fi
echo "---- job output ----"; cat "$work/out"; echo "PASS"
