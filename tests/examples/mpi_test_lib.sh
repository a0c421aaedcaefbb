# Shared by the MPI scripts in tests/examples: run mlp_demo under mpirun in
# the background, find its ranks' pids, wait for it to end. Source it after
# setting `mpiexec`, `demo` and `work` (a scratch directory).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Every rank of a job this script starts carries this id in its environment.
export ZS_MPI_TEST_ID="zs-mpi-test-$$-$RANDOM"
launcher=""

# Pids of this script's ranks, "rank:pid" per line.
our_ranks() {
  local environ rank
  for environ in /proc/[0-9]*/environ; do
    [ -r "$environ" ] || continue
    tr "\\0" "\\n" 2>/dev/null <"$environ" | grep -qx "ZS_MPI_TEST_ID=$ZS_MPI_TEST_ID" || continue
    rank=$(tr "\\0" "\\n" 2>/dev/null <"$environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] && echo "$rank:$(basename "$(dirname "$environ")")"
  done
}

cleanup() {
  local entry
  for entry in $(our_ranks); do
    kill -CONT "${entry#*:}" 2>/dev/null
    kill -KILL "${entry#*:}" 2>/dev/null
  done
  [ -n "$launcher" ] && kill -KILL "$launcher" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# launch_demo OUTFILE NP [MPIRUN FLAGS...] -- [DEMO FLAGS...]: starts the job
# in the background; $launcher is mpirun's pid.
launch_demo() {
  local out=$1 np=$2
  shift 2
  local mpi_flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    mpi_flags+=("$1")
    shift
  done
  [ "${1:-}" = "--" ] && shift
  "$mpiexec" --allow-run-as-root --oversubscribe --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none "${mpi_flags[@]}" -np "$np" \
    "$demo" --backend mpi "$@" >"$out" 2>&1 &
  launcher=$!
}

# wait_for_ranks N: sets $rank_pids ("rank:pid" lines) once N ranks run; 1
# when the job ended first or 60 s passed.
wait_for_ranks() {
  local n=$1
  for _ in $(seq 1 600); do
    rank_pids=$(our_ranks)
    [ "$(echo "$rank_pids" | grep -c :)" = "$n" ] && return 0
    kill -0 "$launcher" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_for_exit SECONDS: waits for mpirun; sets $rc and $elapsed_ms (since
# $start_ms); 1 when it is still running after SECONDS.
wait_for_exit() {
  local limit=$1
  for _ in $(seq 1 $((limit * 10))); do
    if ! kill -0 "$launcher" 2>/dev/null; then
      wait "$launcher"
      rc=$?
      launcher=""
      elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
      return 0
    fi
    sleep 0.1
  done
  return 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }
seconds() { printf "%d.%03d" $(($1 / 1000)) $(($1 % 1000)); }

# Prints the failure and every rank's output ($work/*.out), then exits 1.
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.out; do
    echo "---- $f ----"
    cat "$f"
  done
  exit 1
}
