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
