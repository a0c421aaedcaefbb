#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md): runs every GPU test binary and every
# *_gpu_bench of the bundle that perf/gpu/bundle.sh made, on a machine with a
# GPU, within a time budget, and prints a short table last.
#
# usage: bash perf/gpu/check.sh [--bundle DIR | --build-dir DIR] [--dry-run]
#                               [--expect-binaries] [--budget SECONDS]
#   --bundle DIR       what bundle.sh made (default perf/gpu/bundle)
#   --build-dir DIR    run from a build tree instead (tests: ctest's label gpu)
#   --dry-run          list what would run and with which libraries; no GPU
#                      needed, nothing run
#   --expect-binaries  (dry run) fail when there is nothing to run
#   --budget SECONDS   the whole run's time (default 270); each test and bench
#                      gets at most 120 s of it
# Results: ${OUT:-perf/gpu/results}/results.txt (every log) and results.json.
# Verdicts: a test passes when it exits 0 and skips nothing, except a skip
# that says it "needs N CUDA device(s), found M" with M >= 1 (the machine has
# too few GPUs, not none); a bench (*_gpu_bench, run as `NAME --json FILE`)
# passes when it exits 0, which adam_gpu_bench does only with AdamW at >= 0.9
# of the device copy's bandwidth. Exit codes: 0 all passed; 1 something
# failed, skipped or ran out of time; 2 usage or a missing bundle; 3 no GPU.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bundle="${root}/perf/gpu/bundle"
build_dir=""
dry_run=0
expect_binaries=0
budget=270
item_limit=120

usage_error() {
  echo "check.sh: $*; see --help" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --bundle) [[ $# -ge 2 ]] || usage_error "--bundle needs a folder"; bundle=$(realpath -m "$2"); shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || usage_error "--build-dir needs a folder"; build_dir=$(realpath -m "$2"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --expect-binaries) expect_binaries=1; shift ;;
    --budget) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || usage_error "--budget needs seconds"; budget="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage_error "unknown argument '$1'" ;;
  esac
done
start_s=${SECONDS}

# ---- What to run: parallel arrays kind / name / binary / args (one string,
# arguments separated by newlines).
kinds=() names=() bins=() argss=()
add_item() { kinds+=("$1"); names+=("$2"); bins+=("$3"); argss+=("$4"); }

lib_dirs=()
if [[ -n "${build_dir}" ]]; then
  source_desc="build tree ${build_dir}"
  [[ -d "${build_dir}" ]] || usage_error "no build tree at ${build_dir}"
  listing=$(python3 "${root}/perf/gpu/list_gpu_tests.py" "${build_dir}") || exit 2
  while IFS=$'\t' read -r -a fields; do
    [[ ${#fields[@]} -gt 0 ]] || continue
    add_item test "${fields[0]}" "${fields[1]:-}" "$(printf '%s\n' "${fields[@]:2}")"
  done <<<"${listing}"
  while read -r binary; do
    add_item bench "$(basename "${binary}")" "${binary}" ""
  done < <(find "${build_dir}/perf" -name '*_gpu_bench' -type f -perm -u+x 2>/dev/null | sort)
else
  source_desc="bundle ${bundle}"
  if [[ ! -d "${bundle}/tests" ]]; then
    echo "check.sh: no bundle at ${bundle}: run perf/gpu/bundle.sh on the build machine and carry" \
      "perf/gpu/bundle (or give --build-dir)" >&2
    exit 2
  fi
  for binary in "${bundle}"/tests/*; do
    [[ -f "${binary}" && "${binary}" != *.args ]] || continue
    args=""
    [[ -f "${binary}.args" ]] && args=$(<"${binary}.args")
    add_item test "$(basename "${binary}")" "${binary}" "${args}"
  done
  for binary in "${bundle}"/bench/*_gpu_bench; do
    [[ -f "${binary}" ]] && add_item bench "$(basename "${binary}")" "${binary}" ""
  done
  lib_dirs+=("${bundle}/lib")
fi

# ---- Libraries: the bundle's (gzipped ones unpacked to a scratch folder),
# the NCCL / cuBLAS of the image's nvidia-* Python wheels, the toolkit's.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/zs-gpucheck.XXXXXX")
trap 'rm -rf "${scratch}"' EXIT
logs="${scratch}/logs"
mkdir -p "${logs}" "${scratch}/lib"
if [[ -z "${build_dir}" ]]; then
  for packed in "${bundle}"/lib/*.gz; do
    [[ -f "${packed}" ]] && gzip -dc "${packed}" >"${scratch}/lib/$(basename "${packed}" .gz)"
  done
  lib_dirs=("${scratch}/lib" "${lib_dirs[@]}")
  # This image's libstdc++ if it has every GLIBCXX version the binaries
  # need, else the build machine's (bundle.sh's lib-fallback).
  needs_glibcxx=$(sed -n 's/^needs_glibcxx //p' "${bundle}/MANIFEST" 2>/dev/null)
  system_stdcxx=$(ldconfig -p 2>/dev/null | sed -n 's/.*libstdc++\.so\.6 (libc6,x86-64) => //p' | head -1)
  if [[ -n "${needs_glibcxx}" && -f "${bundle}/lib-fallback/libstdc++.so.6.gz" ]] &&
    ! { [[ -n "${system_stdcxx}" ]] && grep -aq "GLIBCXX_${needs_glibcxx}" "${system_stdcxx}"; }; then
    mkdir -p "${scratch}/fallback"
    gzip -dc "${bundle}/lib-fallback/libstdc++.so.6.gz" >"${scratch}/fallback/libstdc++.so.6"
    lib_dirs+=("${scratch}/fallback")
    echo "check.sh: this machine's libstdc++ (${system_stdcxx:-none}) lacks GLIBCXX_${needs_glibcxx}; using the bundle's"
  fi
fi
if command -v python3 >/dev/null; then
  while read -r dir; do
    [[ -n "${dir}" ]] && lib_dirs+=("${dir}")
  done < <(python3 - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
dirs = set()
for root in nvidia.__path__:
    for pattern in ("*/lib/libnccl.so*", "*/lib/libcublas*.so*", "*/*/lib/libnccl.so*",
                    "*/*/lib/libcublas*.so*"):
        dirs.update(os.path.dirname(f) for f in glob.glob(os.path.join(root, pattern)))
print("\n".join(sorted(dirs)))
EOF
  )
fi
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "${dir}" ]] && lib_dirs+=("${dir}")
done
LD_LIBRARY_PATH=$(IFS=:; echo "${lib_dirs[*]}")${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
export LD_LIBRARY_PATH

missing_libs() {  # the libraries ldd cannot find for a binary, space-separated
  ldd "$1" 2>/dev/null | awk '/=> not found/ { printf "%s ", $1 }'
}

# ---- Dry run: what would run, and whether it is there.
if [[ ${dry_run} -eq 1 ]]; then
  echo "check.sh --dry-run: from ${source_desc}"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH}"
  problems=0
  for i in "${!kinds[@]}"; do
    line="${kinds[i]} ${names[i]}: ${bins[i]:-(no binary)}"
    [[ -n "${argss[i]}" ]] && line+=" $(tr '\n' ' ' <<<"${argss[i]}")"
    [[ "${kinds[i]}" == bench ]] && line+=" --json RESULTS/${names[i]}.json"
    if [[ -z "${bins[i]}" || ! -x "${bins[i]}" ]]; then
      line+="  [MISSING: not built; cmake --build BUILD --target ${names[i]}]"
      problems=$((problems + 1))
    elif [[ -z "${build_dir}" && -n "$(missing_libs "${bins[i]}")" ]]; then
      line+="  [libraries not found here: $(missing_libs "${bins[i]}")]"
    fi
    echo "  would run ${line} (timeout ${item_limit} s)"
  done
  echo "check.sh --dry-run: ${#kinds[@]} to run, ${problems} missing; budget ${budget} s"
  if [[ ${problems} -gt 0 ]]; then
    exit 1
  fi
  if [[ ${expect_binaries} -eq 1 && ${#kinds[@]} -eq 0 ]]; then
    echo "check.sh --dry-run: nothing to run, but --expect-binaries" >&2
    exit 1
  fi
  exit 0
fi

# ---- A GPU, or nothing to check.
gpu_count=0
if command -v nvidia-smi >/dev/null; then
  gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [[ ${gpu_count} -eq 0 ]]; then
  echo "check.sh: no CUDA device: nothing checked (nvidia-smi $(command -v nvidia-smi >/dev/null &&
    echo 'lists no GPU' || echo 'is not installed'); ${#kinds[@]} tests and benches from" \
    "${source_desc} not run)"
  exit 3
fi
gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv,noheader 2>/dev/null | head -1)
echo "check.sh: ${gpu_count} GPU(s): ${gpu_line}"
echo "check.sh: from ${source_desc}; budget ${budget} s"
if [[ -z "${build_dir}" && -f "${bundle}/MANIFEST" ]]; then
  sed 's/^/check.sh: bundle /' "${bundle}/MANIFEST"
  # A bundle built from another commit tests other code: say so up front.
  bundle_commit=$(sed -n 's/^commit //p' "${bundle}/MANIFEST")
  tree_commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || true)
  if [[ -n "${tree_commit}" && -n "${bundle_commit}" && "${bundle_commit}" != "${tree_commit}" ]]; then
    echo "check.sh: warning: the bundle was built from ${bundle_commit}, this tree is at" \
      "${tree_commit}; run perf/gpu/bundle.sh again to test this tree's code"
  fi
  # A glibc older than the build machine's symbols: every binary would fail
  # to load; say why once, up front.
  needs_glibc=$(sed -n 's/^needs_glibc //p' "${bundle}/MANIFEST")
  have_glibc=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
  if [[ -n "${needs_glibc}" && -n "${have_glibc}" &&
    "$(printf '%s\n' "${needs_glibc}" "${have_glibc}" | sort -V | head -1)" != "${needs_glibc}" ]]; then
    echo "check.sh: warning: the bundle needs glibc ${needs_glibc}, this machine has ${have_glibc};" \
      "build the bundle on an older system or build on this machine (--build-dir)"
  fi
fi

results_dir="${OUT:-${root}/perf/gpu/results}"
mkdir -p "${results_dir}"

# Classifies a gtest log's skips: prints "bad" for any skip other than
# "needs N CUDA device(s), found M" with 1 <= M < N, else the number of
# accepted (too few GPUs) skips.
classify_skips() {
  awk '
    /^\[ RUN      \]/ { reason = "" }
    /needs [0-9]+ CUDA device\(s\), found [0-9]+/ {
      match($0, /needs [0-9]+/); need = substr($0, RSTART + 6, RLENGTH - 6) + 0
      match($0, /found [0-9]+/); found = substr($0, RSTART + 6, RLENGTH - 6) + 0
      if (found >= 1 && need > found) reason = "fewgpus"
    }
    /^\[  SKIPPED \] [A-Za-z0-9_\/]+\.[A-Za-z0-9_\/]+ \(/ {
      if (reason == "fewgpus") ok++; else bad++
    }
    END { if (bad > 0) print "bad"; else print ok + 0 }
  ' "$1"
}

statuses=() notes=() seconds=() rcs=()
failures=0
for i in "${!kinds[@]}"; do
  name="${names[i]}"
  log="${logs}/${kinds[i]}.${name}.log"
  left=$((budget - (SECONDS - start_s)))
  limit=$((left < item_limit ? left : item_limit))
  if [[ ${limit} -lt 5 ]]; then
    statuses+=("not run"); notes+=("time budget spent"); seconds+=(0); rcs+=(-1)
    failures=$((failures + 1))
    continue
  fi
  args=()
  [[ -n "${argss[i]}" ]] && mapfile -t args <<<"${argss[i]}"
  [[ "${kinds[i]}" == bench ]] && args+=(--json "${logs}/${name}.json")
  missing=$(missing_libs "${bins[i]}")
  echo "check.sh: ${kinds[i]} ${name} (timeout ${limit} s)"
  t0=${SECONDS}
  if [[ -n "${missing}" ]]; then
    echo "libraries not found: ${missing}(LD_LIBRARY_PATH=${LD_LIBRARY_PATH})" >"${log}"
    rc=127
  else
    timeout --kill-after=5 "${limit}" "${bins[i]}" "${args[@]}" >"${log}" 2>&1
    rc=$?
  fi
  seconds+=($((SECONDS - t0)))
  rcs+=("${rc}")
  status="passed"
  note=""
  if [[ -n "${missing}" ]]; then
    status="failed"; note="missing ${missing}"
  elif [[ ${rc} -eq 124 || ${rc} -eq 137 ]]; then
    status="failed"; note="timed out after ${limit} s"
  elif [[ ${rc} -eq 77 ]]; then
    status="skipped"; note="exit 77: saw no GPU"
  elif [[ ${rc} -ne 0 ]]; then
    status="failed"; note="exit ${rc}"
  elif [[ "${kinds[i]}" == test ]]; then
    skips=$(classify_skips "${log}")
    if [[ "${skips}" == bad ]]; then
      status="skipped"; note="gtest skipped tests with a GPU present"
    elif [[ "${skips}" -gt 0 ]]; then
      note="${skips} skipped: need more GPUs than ${gpu_count}"
    fi
  fi
  [[ "${status}" == passed ]] || failures=$((failures + 1))
  statuses+=("${status}")
  notes+=("${note}")
done

# ---- results.txt: every log; results.json: the verdicts and the benches' JSON.
{
  echo "zeroshard GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "GPU: ${gpu_line}"
  echo "from: ${source_desc}"
  [[ -f "${bundle}/MANIFEST" && -z "${build_dir}" ]] && sed 's/^/bundle: /' "${bundle}/MANIFEST"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH}"
  for i in "${!kinds[@]}"; do
    echo
    echo "===== ${kinds[i]} ${names[i]}: ${statuses[i]} ${notes[i]:+(${notes[i]}) }rc=${rcs[i]} ${seconds[i]} s"
    cat "${logs}/${kinds[i]}.${names[i]}.log" 2>/dev/null
  done
} >"${results_dir}/results.txt"
{
  printf '{\n  "gpu": "%s",\n  "failures": %d,\n  "items": [' "${gpu_line//\"/}" "${failures}"
  for i in "${!kinds[@]}"; do
    [[ ${i} -gt 0 ]] && printf ','
    printf '\n    {"kind": "%s", "name": "%s", "status": "%s", "note": "%s", "rc": %d, "seconds": %d, "figures": ' \
      "${kinds[i]}" "${names[i]}" "${statuses[i]}" "${notes[i]//\"/}" "${rcs[i]}" "${seconds[i]}"
    if [[ -s "${logs}/${names[i]}.json" ]]; then cat "${logs}/${names[i]}.json"; else printf 'null'; fi
    printf '}'
  done
  printf '\n  ]\n}\n'
} >"${results_dir}/results.json"

# ---- The table, last.
echo
echo "=== zeroshard GPU check: ${gpu_line} ==="
printf '%-34s %-8s %5s  %s\n' "test / bench" "result" "s" "note"
for i in "${!kinds[@]}"; do
  printf '%-34s %-8s %5s  %s\n' "${names[i]}" "${statuses[i]}" "${seconds[i]}" "${notes[i]}"
done
for i in "${!kinds[@]}"; do
  [[ "${kinds[i]}" == bench ]] || continue
  # A bench's own table: the rows its JSON lists (variant, GB/s, ratio).
  if [[ -s "${logs}/${names[i]}.json" ]] && command -v python3 >/dev/null; then
    python3 - "${logs}/${names[i]}.json" "${names[i]}" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
    if "summary" in data:
        print(f"{sys.argv[2]}:")
        for line in data["summary"]:
            print(f"  {line}")
        sys.exit(0)
    print(f"{sys.argv[2]} ({data.get('params', '?')} params; ratio needed "
          f"{data.get('min_ratio', '?')}):")
    for r in data.get("results", []):
        print(f"  {r['variant']:<28} adam {r['adam_gbps']:8.1f} GB/s   copy "
              f"{r['copy_gbps']:8.1f} GB/s   ratio {r['ratio']:.3f}  "
              f"{'ok' if r['passed'] else 'BELOW'}")
except (OSError, ValueError, KeyError, TypeError) as error:
    print(f"{sys.argv[2]}: its JSON has no AdamW-style results ({error}); see results.txt")
EOF
  fi
done
echo "results: ${results_dir}/results.txt, results.json"
if [[ ${failures} -gt 0 ]]; then
  echo "GPU CHECK FAILED: ${failures} of ${#kinds[@]} failed, skipped or not run"
  exit 1
fi
if [[ ${#kinds[@]} -eq 0 ]]; then
  echo "GPU CHECK FAILED: nothing to run in ${source_desc}"
  exit 1
fi
echo "GPU CHECK PASSED: ${#kinds[@]} tests and benches"
