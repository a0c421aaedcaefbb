#!/usr/bin/env bash
# Ranks that save into different directories (what ranks on machines
# without a shared file system do with the same relative path) fail the run
# at once, on every rank, naming the ranks and the directory, with a
# non-zero exit and nothing saved; ranks that reach one directory by
# different paths (a symlink, "./", a trailing slash) save and resume.
#
#   mpi_checkpoint_dir_test.sh MPIEXEC DEMO
set -u
mpiexec=$1
demo=$2
work=$(mktemp -d)
# shellcheck source=tests/examples/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
flags=(--backend mpi --steps 30 --save-every 10 --keep-last 3 --hidden 64 --blocks 2
  --comm-timeout 20)
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none)

# 1. Ranks 0-1 save into ckA, ranks 2-3 into ckB.
cd "$work" || exit 1
start_ms=$(now_ms)
timeout 120 "${mpi[@]}" -np 2 "$demo" "${flags[@]}" --checkpoint-dir ckA : \
  -np 2 "$demo" "${flags[@]}" --checkpoint-dir ckB >"$work/split.out" 2>&1
rc=$?
echo "ranks in ckA and ckB: exit $rc after $(seconds $(($(now_ms) - start_ms))) s"
[ "$rc" != 0 ] || fail "the run exited 0 with its ranks saving into two directories"
[ "$rc" != 124 ] || fail "the run hung"
failures=$(grep -c "mlp_demo: run failed: .*ranks 2, 3 do not see the checkpoint directory rank 0 prepared at ckA .*shared file system" "$work/split.out")
[ "$failures" = 4 ] || fail "$failures of 4 ranks reported ranks 2 and 3 and the directory"
grep -m1 "run failed" "$work/split.out"
[ ! -e ckA/latest ] && [ ! -e ckB/latest ] || fail "a checkpoint was committed"

# 2. One directory by three spellings: ck, a symlink to it, ./ck/.
mkdir ck && ln -s ck link
start_ms=$(now_ms)
timeout 300 "${mpi[@]}" -np 2 "$demo" "${flags[@]}" --checkpoint-dir ck : \
  -np 1 "$demo" "${flags[@]}" --checkpoint-dir link : \
  -np 1 "$demo" "${flags[@]}" --checkpoint-dir ./ck/ >"$work/same.out" 2>&1
rc=$?
echo "one directory, three paths: exit $rc after $(seconds $(($(now_ms) - start_ms))) s"
[ "$rc" = 0 ] || fail "the run whose ranks share one directory failed"
[ "$(cat ck/latest)" = step_00000030 ] || fail "latest is '$(cat ck/latest)', not step_00000030"
# Resume from step 20 (the documented rollback: name it in `latest`), so
# that the resumed run trains 10 steps and its weights can be held to the
# one-rank baseline's.
echo step_00000020 >ck/latest
timeout 300 "${mpi[@]}" -np 4 "$demo" "${flags[@]}" --checkpoint-dir link --resume \
  >"$work/resumed.out" 2>&1
rc=$?
echo "resumed through the symlink: exit $rc"
[ "$rc" = 0 ] || fail "the resumed run failed"
grep -q "resumed from link/step_00000020: step 20" "$work/resumed.out" ||
  fail "the resumed run did not resume step 20"
grep -q "bitwise identical: yes" "$work/resumed.out" ||
  fail "the resumed run's weights differ from the one-rank baseline's"

# 3. One relative path from two working directories: two directories, and
# the message shows where "ck" resolves on rank 0 and on the ranks that
# differ (it read "prepared at ck (rank 2 saves into ck)" before).
mkdir -p w0 w1
timeout 120 "${mpi[@]}" -np 2 -wdir "$work/w0" "$demo" "${flags[@]}" --checkpoint-dir ck : \
  -np 2 -wdir "$work/w1" "$demo" "${flags[@]}" --checkpoint-dir ck >"$work/wdir.out" 2>&1
rc=$?
echo "one relative path from two working directories: exit $rc"
[ "$rc" != 0 ] || fail "the run exited 0 with its ranks saving into two directories"
grep -q "prepared at ck ($work/w0/ck)" "$work/wdir.out" ||
  fail "the message does not show rank 0's absolute path: $(grep -m1 'run failed' "$work/wdir.out")"
grep -q "saves into ck ($work/w1/ck)" "$work/wdir.out" ||
  fail "the message does not show rank 2's absolute path: $(grep -m1 'run failed' "$work/wdir.out")"
grep -m1 "run failed" "$work/wdir.out"
echo "PASS"
