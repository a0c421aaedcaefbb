#!/usr/bin/env bash
# A killed rank costs minutes, not the run: a 4-process mlp_demo run that
# saves every 20 steps loses rank 2 to SIGKILL; the survivors exit naming it
# within the communicator timeout and mpirun exits non-zero. Rerun with
# --resume, the job finishes from the last complete checkpoint and its final
# weights equal the uninterrupted one-rank baseline's bit for bit (which the
# distributed run equals when nothing goes wrong). The same checkpoint also
# resumes on 2 processes (resharded).
#
#   mpi_resume_test.sh MPIEXEC DEMO
set -u
mpiexec=$1
demo=$2
timeout_s=10
steps=200
work=$(mktemp -d)
# shellcheck source=tests/examples/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
ckpt=$work/ckpt

flags=(--steps "$steps" --save-every 20 --checkpoint-dir "$ckpt" --comm-timeout "$timeout_s")

# 1. The run that loses a rank.
launch_demo "$work/killed.out" 4 -- "${flags[@]}"
wait_for_ranks 4 || fail "the 4 ranks did not all start"
pid=$(echo "$rank_pids" | sed -n 's/^2://p')
for _ in $(seq 1 1200); do
  latest=$(cat "$ckpt/latest" 2>/dev/null)
  [ "${latest#step_}" ] && [ "$((10#${latest#step_}))" -ge 60 ] 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || fail "the run ended before its step-60 checkpoint"
  sleep 0.1
done
[ -n "${latest:-}" ] || fail "no checkpoint after 120 s"
start_ms=$(now_ms)
kill -KILL "$pid" || fail "could not kill rank 2 (pid $pid)"
wait_for_exit 60 || fail "the job was still running 60 s after rank 2 was killed"
echo "SIGKILL of rank 2 (pid $pid) after checkpoint $latest: the job ended in $(seconds "$elapsed_ms") s with exit status $rc"
[ "$rc" != 0 ] || fail "mpirun exited 0 after a rank was killed"
((elapsed_ms <= timeout_s * 1000)) || fail "took longer than the ${timeout_s} s timeout"
grep -Eq "run failed: .*rank 2 \\(pid $pid on [^)]*\\) died" "$work/killed.out" ||
  fail "no survivor named rank 2 as dead"
cp -r "$ckpt" "$work/ckpt_copy"
resumed_from=$(cat "$ckpt/latest")

# 2. Resume on 4 processes: finishes, bitwise equal to the baseline.
start_ms=$(now_ms)
launch_demo "$work/resumed.out" 4 -- "${flags[@]}" --resume
wait_for_exit 300 || fail "the resumed run did not finish within 300 s"
echo "resumed on 4 processes from $resumed_from: exit $rc after $(seconds "$elapsed_ms") s"
[ "$rc" = 0 ] || fail "the resumed run failed"
grep -q "resumed from $ckpt/$resumed_from: step" "$work/resumed.out" ||
  fail "the resumed run did not say what it resumed from"
grep -q "bitwise identical: yes" "$work/resumed.out" ||
  fail "the resumed run's final weights differ from the uninterrupted baseline's"
grep "resumed from\|bitwise identical" "$work/resumed.out"

# 3. The same checkpoint on 2 processes (resharded).
start_ms=$(now_ms)
launch_demo "$work/two.out" 2 -- "${flags[@]/$ckpt/$work/ckpt_copy}" --resume
wait_for_exit 300 || fail "the 2-process resume did not finish within 300 s"
echo "resumed on 2 processes from $resumed_from: exit $rc after $(seconds "$elapsed_ms") s"
[ "$rc" = 0 ] || fail "the 2-process resume failed"
grep -q "written by 4 rank(s)" "$work/two.out" || fail "the 2-process run did not resume the 4-rank checkpoint"
grep "resumed from\|written by 4 rank" "$work/two.out" | head -2
echo "PASS"
