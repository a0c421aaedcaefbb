#!/usr/bin/env bash
# perf/peers/param_groups.sh: zeroshard's AdamW with two param groups against
# torch.optim.AdamW with the same two groups, on the same inputs
# (docs/engine_api.md, "Param groups"). Not part of `make test`: it
# downloads PyTorch.
#
#   perf/peers/param_groups.sh [--steps 300] [--seed 19] [--build DIR]
#                              [--venv DIR] [--out DIR] [--torch-spec SPEC]
#
# 1. A venv with PyTorch from the package registry (perf/peers/torch_venv.sh;
#    default build/perf/peers-venv, shared with perf/peers/run.sh). If it
#    cannot be installed the script says why and exits 0 with "skipped".
# 2. param_groups_driver (built with the project) trains one rank, stage 0,
#    fp32, AdamW (lr 1e-2, weight decay 0.1, betas 0.9 / 0.999, eps 1e-8),
#    warm-up (10% of the steps, linear from 0) then cosine to 0.1 x lr, no
#    clipping, on fixed random params and per-step gradients from --seed, and
#    writes them with its final params. Two groups: "decay" (lr_scale 1,
#    the optimizer's weight decay 0.1: block.w and head.w) and "scaled"
#    (lr_scale 0.25, weight decay 0.01: embed.w and block.b). Then once more
#    with one group (--ungrouped), the comparison without groups.
# 3. param_groups_torch.py repeats each run with torch.optim.AdamW (default
#    and fused CPU implementations; each group's lr set every step to
#    schedule * lr_scale) and with a float64 AdamW, and prints the max abs
#    difference of the params after the last step, per group and overall.
# Results: --out DIR (default build/perf/param-groups): grouped.json,
# ungrouped.json and the drivers' files.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
steps=300 seed=19 build="$root/build" venv="" out="" torch_spec="torch"

usage() { sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --torch-spec) torch_spec="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "perf/peers/param_groups: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
venv="${venv:-$root/build/perf/peers-venv}"
out="${out:-$root/build/perf/param-groups}"

driver="$build/perf/peers/param_groups_driver"
if [[ ! -x "$driver" ]]; then
  echo "perf/peers/param_groups: $driver is missing: build first (make, or cmake --build" \
    "build --target param_groups_driver), or pass --build DIR" >&2
  exit 1
fi

# shellcheck source=perf/peers/torch_venv.sh
source "$root/perf/peers/torch_venv.sh"
ensure_torch_venv "$venv" "$torch_spec" perf/peers/param_groups

for mode in grouped ungrouped; do
  dir="$out/$mode"
  rm -rf "$dir"
  mkdir -p "$dir"
  flags=(--out "$dir" --steps "$steps" --seed "$seed")
  if [[ $mode == ungrouped ]]; then flags+=(--ungrouped); fi
  "$driver" "${flags[@]}"
  "$venv/bin/python" "$root/perf/peers/param_groups_torch.py" "$dir" --json "$out/$mode.json"
done
