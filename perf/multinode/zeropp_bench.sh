#!/usr/bin/env bash
# ZeRO++ on the emulated cluster (tests/multinode/zs_cluster.sh): mlp_demo at
# stage 3, exact and with each ZeRO++ option, on 2 nodes x 2 ranks and 4
# nodes x 1, with the links unshaped and shaped to 1 Gbit/s (tbf). Per run:
# the collectives' bytes across nodes per step (the engine's communicator
# counters, all ranks), the bytes the nodes' interfaces sent per step (all
# nodes' eth0 tx: payload plus TCP/IP and Open MPI headers and the
# launcher's own messages), the slowest rank's mean step time, and the loss
# against the one-rank baseline. Ratios against the exact run of the same
# shape and link, in one JSON file (make perf's report reads it).
#
#   zeropp_bench.sh MLP_DEMO OUT.json [--steps N] [--smoke]
#     --smoke: 2 x 2 unshaped, exact and qwz,hpz,qgz4, 3 steps (ctest)
set -euo pipefail
demo=$1
out=$2
shift 2
steps=30
smoke=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --smoke) smoke=1; steps=3; shift ;;
    *) echo "zeropp_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cluster=$root/tests/multinode/zs_cluster.sh
export ZS_CLUSTER="zsb$$"
export ZS_MPI_TEST_ID="zs-zeropp-bench-$$"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap '"$cluster" down 2>/dev/null; rm -rf "$work"' EXIT
[ "$(id -u)" = 0 ] || { echo "zeropp_bench.sh: needs root (namespaces)" >&2; exit 1; }

shapes=("2 2" "4 1")
links=("" "1gbit")
options=(exact qwz hpz qgz8 qgz4 "qwz,hpz" "qwz,hpz,qgz8" "qwz,hpz,qgz4")
if [[ ${smoke} -eq 1 ]]; then
  shapes=("2 2")
  links=("")
  options=(exact "qwz,hpz,qgz4")
fi
tx_total() { "$cluster" counters | awk '{ s += $3 } END { printf "%.0f\n", s }'; }

: >"$work/rows.jsonl"
for shape in "${shapes[@]}"; do
  read -r nodes per_node <<<"$shape"
  for link in "${links[@]}"; do
    "$cluster" up "$nodes" ${link:+--rate "$link"} 2>/dev/null
    for opt in "${options[@]}"; do
      zeropp=()
      [[ "$opt" != exact ]] && zeropp=(--zeropp "$opt")
      before=$(tx_total)
      "$cluster" mpirun "$per_node" -x ZS_MPI_TEST_ID -- "$demo" --backend mpi --stage 3 \
        --steps "$steps" "${zeropp[@]}" --comm-timeout 120s --result-json "$work/run.json" \
        >"$work/run.out" 2>&1 || { cat "$work/run.out"; exit 1; }
      after=$(tx_total)
      python3 - "$work/run.json" "$nodes" "$per_node" "${link:-unshaped}" "$opt" "$steps" \
        "$((after - before))" >>"$work/rows.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
nodes, per_node, link, opt, steps, tx = sys.argv[2:8]
steps = int(steps)
d, b = r["losses"], r["baseline_losses"]
worst = max(abs(x - y) / abs(y) for x, y in zip(d, b))
print(json.dumps({"shape": f"{nodes}x{per_node}", "link": link, "options": opt,
                  "steps": steps, "step_ms": r["step_ms"],
                  "inter_node_bytes_per_step": r["inter_node_bytes"] / steps,
                  "interface_tx_bytes_per_step": int(tx) / steps,
                  "loss_max_rel_diff": worst, "final_loss": d[-1],
                  "baseline_final_loss": b[-1]}))
PY
      tail -1 "$work/rows.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); print('zeropp_bench: %(shape)s %(link)-8s %(options)-12s %(inter_node_bytes_per_step)12.0f B/step across nodes (engine), %(interface_tx_bytes_per_step)12.0f B/step (interfaces), %(step_ms)8.1f ms/step, loss within %(loss_max_rel_diff).4f' % r)"
    done
    "$cluster" down
  done
done
python3 - "$work/rows.jsonl" "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
exact = {(r["shape"], r["link"]): r for r in rows if r["options"] == "exact"}
for r in rows:
    e = exact[(r["shape"], r["link"])]
    r["bytes_vs_exact"] = r["inter_node_bytes_per_step"] / e["inter_node_bytes_per_step"]
    r["interface_vs_exact"] = r["interface_tx_bytes_per_step"] / e["interface_tx_bytes_per_step"]
    r["exact_over_step_time"] = e["step_ms"] / r["step_ms"]
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
json.dump({"schema": "zeroshard.zeropp_bench.v1", "cpu": cpu, "rows": rows},
          open(sys.argv[2], "w"), indent=1)
PY
echo "zeropp_bench: wrote $out"
