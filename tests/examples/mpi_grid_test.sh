#!/usr/bin/env bash
# mlp_demo on a model-parallel grid under mpirun, one process per rank:
# (tp, pp, dp) = (2, 1, 2) and (1, 2, 2) on 4 processes train like the
# one-rank baseline of the same global batch: the run ends with status 0,
# the report names the grid, does not flag an unexpected difference, and
# the final weights are within 1e-3 of the baseline's (largest difference
# over a param's largest value; the bound of
# tests/examples/mlp_grid_trainer_test.cc, steps x 2 B gamma_{4h} =
# 20 x 2 x 4 x 128 x 2^-24 ~ 1.2e-3 for this size, rounded down; the
# pipeline run reorders only the dp accumulation). The pipeline run reports
# its bubble. Then: --mem-cap makes every rank plan the same grid and train
# it (plan = ledger); a cap nothing fits ends the job with the planner's
# ResourceExhausted text; ranks started with other grid flags are refused
# at start-up, naming the rank; --mem-cap --machine trains the fastest fit
# (the optimizer on the host here, plan = ledger), and ranks whose profiles
# lead to other choices are refused before training, naming the rank.
#
#   mpi_grid_test.sh MPIEXEC DEMO
set -u
mpiexec=$1
demo=$2
work=$(mktemp -d)
# shellcheck source=tests/examples/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"

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

# The planner under mpirun: sharding alone needs >= 272.5 KiB per rank for
# this model on 4 ranks, tp 2 x pp 1 x dp 2 at stage 1 needs 238.5 KiB.
out=$work/mem_cap.out
start_ms=$(now_ms)
launch_demo "$out" 4 -- "${flags[@]}" --mem-cap 240KiB
wait_for_exit 300 || fail "--mem-cap 240KiB: still running after 300 s"
[ "$rc" = 0 ] || fail "--mem-cap 240KiB: mpirun exited with $rc"
grep -q "chosen: tp 2 x pp 1 x dp 2, stage 1: .*; stages 0-3 alone need" "$out" ||
  fail "--mem-cap 240KiB: the planner's choice is not printed or not tp 2 x pp 1 x dp 2, stage 1"
grep -q "dp 2 x tp 2 x pp 1 (the planner's choice" "$out" || fail "--mem-cap: the report does not name the grid"
grep -q "ledger, largest rank: .*(equal)" "$out" || fail "--mem-cap 240KiB: plan and ledger differ"
grep -q "UNEXPECTED" "$out" && fail "--mem-cap 240KiB: the report flags an unexpected difference"
echo "--mem-cap 240KiB: tp 2 x pp 1 x dp 2, stage 1, ok in $(seconds $(($(now_ms) - start_ms))) s"

out=$work/mem_cap_too_small.out
start_ms=$(now_ms)
launch_demo "$out" 4 -- "${flags[@]}" --mem-cap 100KiB
wait_for_exit 120 || fail "--mem-cap 100KiB: still running after 120 s"
[ "$rc" != 0 ] || fail "--mem-cap 100KiB: exited with 0, expected a failure"
grep -q "RESOURCE_EXHAUSTED: rank 0: --mem-cap 100.0 KiB on 4 ranks: PlanGrid: nothing fits" \
  "$out" ||
  fail "--mem-cap 100KiB: no planner error"
echo "--mem-cap 100KiB: refused (status $rc) in $(seconds $(($(now_ms) - start_ms))) s"

# Per-rank flags that disagree (mpirun's MPMD syntax): refused before any
# rank enters a collective the others do not.
out=$work/mismatch.out
start_ms=$(now_ms)
common=(--allow-run-as-root --oversubscribe --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none)
"$mpiexec" "${common[@]}" -np 3 "$demo" --backend mpi "${flags[@]}" --tp 2 \
  : -np 1 "$demo" --backend mpi "${flags[@]}" --pp 2 >"$out" 2>&1 &
launcher=$!
wait_for_exit 120 || fail "mismatched flags: still running after 120 s"
[ "$rc" != 0 ] || fail "mismatched flags: exited with 0, expected a failure"
grep -q "rank 3 was started with --tp 1 --pp 2 --mem-cap (none) but rank 0 with --tp 2 --pp 1" \
  "$out" || fail "mismatched flags: the error does not name rank 3 and both flag sets"
echo "mismatched --tp/--pp: refused (status $rc) in $(seconds $(($(now_ms) - start_ms))) s"
# --mem-cap --machine: the fastest fit by the calibrated model of a fixed
# profile (its local collectives given to mpi): the host tier, trained.
testdata=$(dirname "$0")/../plan/testdata
sed 's/"local"/"mpi"/' "$testdata/machine-2-cores-offload.json" >"$work/machine.json"
sed 's/"host_copy_gbps": 4.0/"host_copy_gbps": 0.001/' "$work/machine.json" >"$work/slow.json"
offload_flags=(--steps 3 --blocks 8 --hidden 64 --micro-batch 512 --mem-cap 2.25MiB --comm-timeout 30)
out=$work/mem_cap_machine.out
start_ms=$(now_ms)
"$mpiexec" "${common[@]}" -np 2 "$demo" --backend mpi "${offload_flags[@]}" \
  --machine "$work/machine.json" >"$out" 2>&1 &
launcher=$!
wait_for_exit 120 || fail "--mem-cap --machine: still running after 120 s"
[ "$rc" = 0 ] || fail "--mem-cap --machine: mpirun exited with $rc"
grep -q "chosen: tp 1 x pp 1 x dp 2, stage 2, optimizer on host" "$out" ||
  fail "--mem-cap --machine: the host tier is not chosen"
grep -q "ledger, largest rank: .*(equal)" "$out" || fail "--mem-cap --machine: plan and ledger differ"
echo "--mem-cap --machine: host tier, ok in $(seconds $(($(now_ms) - start_ms))) s"

out=$work/machine_mismatch.out
start_ms=$(now_ms)
"$mpiexec" "${common[@]}" -np 1 "$demo" --backend mpi "${offload_flags[@]}" \
  --machine "$work/machine.json" : -np 1 "$demo" --backend mpi "${offload_flags[@]}" \
  --machine "$work/slow.json" >"$out" 2>&1 &
launcher=$!
wait_for_exit 120 || fail "mismatched profiles: still running after 120 s"
[ "$rc" != 0 ] || fail "mismatched profiles: exited with 0, expected a failure"
grep -q "rank 1 chose dp 1 x tp 2 x pp 1, stage 0, optimizer tier 0 under --mem-cap but rank 0 chose" \
  "$out" || fail "mismatched profiles: the error does not name rank 1 and both choices"
echo "mismatched --machine profiles: refused (status $rc) in $(seconds $(($(now_ms) - start_ms))) s"
echo PASS
