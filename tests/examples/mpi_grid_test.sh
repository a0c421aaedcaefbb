#!/usr/bin/env bash
# mlp_demo on a model-parallel grid under mpirun, one process per rank:
# (tp, pp, dp) = (2, 1, 2) and (1, 2, 2) on 4 processes train like the
# one-rank baseline of the same global batch: the run ends with status 0,
# the report names the grid, does not flag an unexpected difference, and
# the final weights are within 1e-3 relative of the baseline's (the
# tolerance of tests/examples/mlp_grid_trainer_test.cc, steps x 2 B
# gamma_{4h} = 20 x 2 x 4 x 1.5e-5 ~ 2.4e-3 for this size, rounded down;
# the pipeline run reorders only the dp accumulation). The pipeline run
# reports its bubble.
#
#   mpi_grid_test.sh MPIEXEC DEMO
set -u
mpiexec=$1
demo=$2
work=$(mktemp -d)
# shellcheck source=tests/examples/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.out; do
    echo "---- $f ----"
    cat "$f"
  done
  exit 1
}

flags=(--steps 20 --hidden 32 --blocks 4 --micro-batch 4 --comm-timeout 30)
for grid in "2 1" "1 2"; do
  read -r tp pp <<<"$grid"
  out=$work/tp${tp}_pp${pp}.out
  start_ms=$(now_ms)
  launch_demo "$out" 4 -- "${flags[@]}" --tp "$tp" --pp "$pp"
  wait_for_exit 300 || fail "tp $tp pp $pp: still running after 300 s"
  [ "$rc" = 0 ] || fail "tp $tp pp $pp: mpirun exited with $rc"
  grep -q "dp 2 x tp $tp x pp $pp" "$out" || fail "tp $tp pp $pp: the report does not name the grid"
  grep -q "UNEXPECTED" "$out" && fail "tp $tp pp $pp: the report flags an unexpected difference"
  rel=$(sed -n 's/.*max relative diff \([0-9.e+-]*\).*/\1/p' "$out" | head -1)
  [ -n "$rel" ] || fail "tp $tp pp $pp: no weight comparison in the report"
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-3) }' || fail "tp $tp pp $pp: weights differ by $rel"
  if [ "$pp" -gt 1 ]; then
    grep -q "pipeline bubble:" "$out" || fail "tp $tp pp $pp: no pipeline bubble in the report"
  fi
  echo "tp $tp pp $pp dp 2: ok in $(seconds $(($(now_ms) - start_ms))) s, weights max rel diff $rel"
done
echo PASS
