#!/usr/bin/env bash
# ctest multinode_zeropp_bench_smoke: zeropp_bench.sh --smoke (2 x 2, exact
# and qwz,hpz,qgz4, 3 steps) and make perf's report of it, checked. Its numbers
# mean nothing; it keeps the benchmark and its report section running.
#
#   zeropp_bench_smoke.sh MLP_DEMO OUT_DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "$2"
mkdir -p "$2"
"$root/perf/multinode/zeropp_bench.sh" "$1" "$2/multinode_zeropp.json" --smoke
python3 "$root/perf/report/make_report.py" --dir "$2" --check --expect multinode
grep -q "^## ZeRO++ across emulated nodes (zeropp_bench.sh)" "$2/report.md"
grep -Eq "^\| 2x2 \| unshaped \| qwz,hpz,qgz4 \| [0-9.]+ \| 0\.[0-9]+ \|" "$2/report.md" ||
  { echo "zeropp_bench_smoke: no qwz,hpz,qgz4 row below the exact run's bytes"; exit 1; }
echo PASS
