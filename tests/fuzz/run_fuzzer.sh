#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz from its checked-in seed corpus and
# dictionary, bounded in time and executions, and exits non-zero on any
# crash, sanitizer report, leak, hang (per-input timeout) or out-of-memory,
# printing the command that reproduces it. `make fuzz` (long runs) and the
# ctest label `fuzz` (smoke runs) both go through here; docs/testing.md.
#
# usage: run_fuzzer.sh [--smoke] FUZZER WORK_DIR
#   FUZZER    a built target, e.g. build-asan/tests/fuzz/hf_config_fuzzer; its
#             seeds are tests/fuzz/corpus/<name without _fuzzer>/, its
#             dictionary tests/fuzz/<name without _fuzzer>.dict (if any)
#   WORK_DIR  receives corpus/ (inputs that found new coverage; kept between
#             long runs) and crashes/ (reproducers)
#   --smoke   a short deterministic run: fixed seed, an empty corpus/ at the
#             start, FUZZ_SMOKE_RUNS executions (30000) within 60 s
# Long runs read (defaults in brackets):
#   FUZZ_SECONDS  time limit in seconds [60]; 0 = none
#   FUZZ_RUNS     executions [-1 = no limit]
#   FUZZ_SEED     libFuzzer -seed [0 = a fresh one]
# Both read:
#   FUZZ_TIMEOUT  seconds one input may take before it is a hang [10]
#   FUZZ_RSS_MB   memory limit in MiB before it is out-of-memory [2048]
set -uo pipefail

smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  shift
fi
if [ $# -ne 2 ]; then
  echo "usage: $0 [--smoke] FUZZER WORK_DIR" >&2
  exit 2
fi
fuzzer=$(realpath -m "$1")
work_dir=$(realpath -m "$2")
name=$(basename "$fuzzer")
short=${name%_fuzzer}
fuzz_src=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$fuzz_src/../.." && pwd)
seeds="$fuzz_src/corpus/$short"
dict="$fuzz_src/$short.dict"
[ -x "$fuzzer" ] || { echo "fuzz: $fuzzer is not built" >&2; exit 2; }
[ -d "$seeds" ] || { echo "fuzz: no seed corpus $seeds" >&2; exit 2; }

if [ "$smoke" = 1 ]; then
  seed=1
  runs=${FUZZ_SMOKE_RUNS:-30000}
  seconds=60
  rm -rf "$work_dir/corpus"
else
  seed=${FUZZ_SEED:-0}
  runs=${FUZZ_RUNS:--1}
  seconds=${FUZZ_SECONDS:-60}
fi
mkdir -p "$work_dir/corpus" "$work_dir/crashes"

flags=(-seed="$seed" -runs="$runs" -max_total_time="$seconds"
  -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}"
  -artifact_prefix="$work_dir/crashes/" -print_final_stats=1 -print_funcs=0)
[ -f "$dict" ] && flags+=(-dict="$dict")

# Paths in the estimate_args seeds are relative to the repository root.
cd "$repo_root" || exit 2
stamp="$work_dir/.started"
touch "$stamp"
echo "fuzz: $name ${flags[*]} $work_dir/corpus $seeds"
# New inputs go to the first directory (the work dir), never to the seeds.
"$fuzzer" "${flags[@]}" "$work_dir/corpus" "$seeds"
status=$?
if [ "$status" -ne 0 ]; then
  echo "fuzz: $name FAILED (exit $status); reproducers in $work_dir/crashes/:" >&2
  found=0
  while IFS= read -r artifact; do
    found=1
    echo "  (cd $repo_root && $fuzzer $artifact)" >&2
  done < <(find "$work_dir/crashes" -type f -newer "$stamp" | sort)
  [ "$found" = 1 ] || echo "  (none written; the log above has the report)" >&2
  exit "$status"
fi
echo "fuzz: $name passed"
