#!/usr/bin/env bash
# Self-test of check.sh's verdicts, with no GPU: a fake nvidia-smi and a fake
# bundle of shell scripts that print what gtest and adam_gpu_bench print. Runs
# check.sh on several such bundles and checks its exit code and table.
# ctest runs it as gpu_check_selftest (label script).
set -euo pipefail

check="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/check.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/zs-gpucheck-selftest.XXXXXX")
trap '[[ -n "${ZS_SELFTEST_KEEP:-}" ]] || rm -rf "${work}"' EXIT
failures=0

# A fake nvidia-smi listing one GPU, or none.
mkdir -p "${work}/one-gpu" "${work}/no-gpu"
cat >"${work}/one-gpu/nvidia-smi" <<'EOF'
#!/bin/sh
if [ "$1" = "-L" ]; then echo "GPU 0: Fake H200 (UUID: GPU-0)"; else echo "Fake H200, 0.0, 1 MiB"; fi
EOF
printf '#!/bin/sh\nexit 0\n' >"${work}/no-gpu/nvidia-smi"
chmod +x "${work}/one-gpu/nvidia-smi" "${work}/no-gpu/nvidia-smi"

# fake_test DIR NAME KIND: a gtest-like binary that passes, skips for too few
# GPUs, skips for no GPU, fails, or hangs.
fake_test() {
  local file="$1/tests/$2"
  case "$3" in
    pass) printf '#!/bin/sh\necho "[ RUN      ] A.B"\necho "[       OK ] A.B (1 ms)"\necho "[  PASSED  ] 1 test."\n' ;;
    fewgpus | nogpu)
      local reason="needs 2 CUDA device(s), found 1"
      [[ "$3" == nogpu ]] && reason="no CUDA device: A.C not run"
      printf '#!/bin/sh\necho "[ RUN      ] A.B"\necho "[       OK ] A.B (1 ms)"\necho "[ RUN      ] A.C"\n'
      printf 'echo "x.cc:1: Skipped"\necho "%s"\necho\necho "[  SKIPPED ] A.C (0 ms)"\n' "${reason}"
      printf 'echo "[  PASSED  ] 1 test."\necho "[  SKIPPED ] 1 test, listed below:"\necho "[  SKIPPED ] A.C"\n' ;;
    fail) printf '#!/bin/sh\necho "[  FAILED  ] A.B"\nexit 1\n' ;;
    hang) printf '#!/bin/sh\nexec sleep 30\n' ;;
  esac >"${file}"
  chmod +x "${file}"
}

# fake_bench DIR RATIO: writes adam_gpu_bench's JSON; exits 1 under 0.9.
fake_bench() {
  local file="$1/bench/adam_gpu_bench"
  cat >"${file}" <<EOF
#!/bin/sh
[ "\$1" = "--json" ] || { echo "expected --json FILE" >&2; exit 2; }
passed=true; rc=0
if [ "\$(echo "$2 < 0.9" | awk '{ print (\$1 < \$3) }')" = 1 ]; then passed=false; rc=1; fi
cat >"\$2" <<JSON
{"bench": "adam_gpu_bench", "params": 268435456, "min_ratio": 0.9, "results": [
 {"variant": "adamw fp32", "adam_gbps": 4000.0, "copy_gbps": 4200.0, "ratio": $2, "passed": \$passed}]}
JSON
exit \$rc
EOF
  chmod +x "${file}"
}

new_bundle() {
  local dir="${work}/$1"
  mkdir -p "${dir}/tests" "${dir}/bench" "${dir}/lib"
  echo "commit selftest" >"${dir}/MANIFEST"
  echo "${dir}"
}

# expect NAME WANT_RC PATTERN... -- ARGS: runs check.sh, checks its exit code
# and that each PATTERN (an extended regex) is in its output.
expect() {
  local name="$1" want="$2"
  shift 2
  local patterns=()
  while [[ "$1" != "--" ]]; do
    patterns+=("$1")
    shift
  done
  shift
  local out="${work}/out-${name}" rc=0
  mkdir -p "${out}"
  OUT="${out}" "$@" >"${out}/stdout" 2>&1 || rc=$?
  local ok=1
  [[ ${rc} -eq ${want} ]] || ok=0
  for pattern in "${patterns[@]}"; do
    grep -Eq -- "${pattern}" "${out}/stdout" || { ok=0; echo "  missing: ${pattern}"; }
  done
  if [[ -f "${out}/results.json" ]] && ! python3 -m json.tool "${out}/results.json" >/dev/null; then
    ok=0
    echo "  results.json is not valid JSON"
  fi
  if [[ ${ok} -eq 1 ]]; then
    echo "ok   ${name} (exit ${rc})"
  else
    echo "FAIL ${name}: exit ${rc}, wanted ${want}; its output:"
    sed 's/^/  | /' "${out}/stdout"
    failures=$((failures + 1))
  fi
}

with_gpu=(env "PATH=${work}/one-gpu:${PATH}" bash "${check}")
without_gpu=(env "PATH=${work}/no-gpu:${PATH}" bash "${check}")

b=$(new_bundle good)
fake_test "${b}" a_test pass
fake_test "${b}" nccl_test fewgpus
fake_bench "${b}" 0.95
expect all-pass 0 'a_test +passed' 'nccl_test +passed .*1 skipped: need more GPUs' \
  'adamw fp32 .*ratio 0.950' 'GPU CHECK PASSED' -- "${with_gpu[@]}" --bundle "${b}"
expect no-gpu 3 'no CUDA device: nothing checked' -- "${without_gpu[@]}" --bundle "${b}"
expect dry-run 0 'would run test a_test' 'would run bench adam_gpu_bench' \
  -- "${without_gpu[@]}" --bundle "${b}" --dry-run

b=$(new_bundle skip)
fake_test "${b}" a_test pass
fake_test "${b}" b_test nogpu
expect skip-fails 1 'b_test +skipped' 'GPU CHECK FAILED: 1 of 2' -- "${with_gpu[@]}" --bundle "${b}"

b=$(new_bundle slow)
fake_bench "${b}" 0.5
fake_test "${b}" c_test fail
expect low-ratio-and-failure 1 'adam_gpu_bench +failed +[0-9]+ +exit 1' 'ratio 0.500  BELOW' \
  'c_test +failed' 'GPU CHECK FAILED: 2 of 2' -- "${with_gpu[@]}" --bundle "${b}"

b=$(new_bundle hang)
fake_test "${b}" d_test hang
fake_test "${b}" e_test pass
# A budget of 15 s: d_test hangs until the budget is spent (a test is not
# started with under 5 s left), so e_test is not run. With 6 s, a loaded
# machine (CI on 2 busy cores) spent over a second before the first test and
# d_test itself was "not run".
expect budget 1 'd_test +failed .*timed out after [0-9]+ s' 'e_test +not run .*time budget' \
  -- "${with_gpu[@]}" --bundle "${b}" --budget 15

expect no-bundle 2 'no bundle at' -- "${with_gpu[@]}" --bundle "${work}/none"

if [[ ${failures} -gt 0 ]]; then
  echo "check_selftest: ${failures} case(s) failed"
  exit 1
fi
echo "check_selftest: all cases passed"
