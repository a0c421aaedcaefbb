#!/usr/bin/env bash
# Builds the GPU test binaries and the GPU benchmarks here (no GPU needed) and
# packs them, with the shared libraries a GPU machine may lack, into
# perf/gpu/bundle/ for perf/gpu/check.sh to run there (docs/gpu.md, "The
# prepared GPU check").
#
# usage: perf/gpu/bundle.sh [--build-dir DIR] [--jobs N] [--max-mib N]
#   --build-dir  build tree to configure and build (default build-gpubundle:
#                Release, CUDA for sm_90 only, no MPI)
#   --jobs       parallel build jobs (default 2)
#   --max-mib    fail when the bundle is larger (default 48; the device tool
#                carries at most 64 MiB per call, working tree included)
#
# What goes in:
#   tests/NAME      every ctest test labelled `gpu` (its binary, stripped), with
#                   tests/NAME.args (one argument a line) when ctest passes any
#   bench/NAME      every *_gpu_bench binary (stripped)
#   lib/            the libraries ldd finds that are neither the C runtime nor
#                   the driver nor in the GPU image's CUDA wheels: abseil,
#                   OpenBLAS, gfortran, quadmath, cudart (688 KiB, the runtime
#                   these binaries were built against); files over 1 MiB as
#                   .gz (OpenBLAS is 35 MiB, 10 MiB gzipped): check.sh unpacks
#   lib-fallback/   libstdc++ of this machine (gzipped); check.sh uses it only
#                   where the GPU machine's own lacks a GLIBCXX version we need
#   external.txt    libraries left out because the GPU image has them in its
#                   Python wheels or its driver (NCCL 208 MiB, cuBLASLt 517 MiB)
#   MANIFEST        commit, date, the newest GLIBC / GLIBCXX symbol versions
#                   needed
# Not bundled: glibc (libc, libm, libdl, libpthread, librt, the loader),
# libgcc_s (every newer image has a newer one), libcuda and libnvidia-* (the
# driver's, they must match the kernel module).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir="${root}/build-gpubundle"
jobs=2
max_mib=48
bundle="${root}/perf/gpu/bundle"

die() {
  echo "bundle.sh: $*" >&2
  exit 1
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=$(realpath -m "$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --max-mib) max_mib="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

command -v python3 >/dev/null || die "needs python3 (to read ctest's test list)"
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  die "needs the CUDA toolkit (nvcc) to build the GPU binaries"

echo "bundle.sh: configuring ${build_dir} (Release, sm_90, CUDA on, MPI off)"
cmake -S "${root}" -B "${build_dir}" -DCMAKE_BUILD_TYPE=Release -DZS_CUDA=ON \
  -DZS_CUDA_ARCHITECTURES=90 -DZS_MPI=OFF >/dev/null

# The targets: every gpu-labelled test that is a target of its own name, and
# every *_gpu_bench.
known_targets=$(cmake --build "${build_dir}" --target help | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')
targets=()
while read -r name; do
  if grep -qx "${name}" <<<"${known_targets}"; then
    targets+=("${name}")
  else
    echo "bundle.sh: warning: gpu test ${name} is no target of that name; build it by hand" >&2
  fi
done < <(python3 "${root}/perf/gpu/list_gpu_tests.py" "${build_dir}" --names)
while read -r name; do
  targets+=("${name}")
done < <(grep -E '_gpu_bench$' <<<"${known_targets}" || true)
[[ ${#targets[@]} -gt 0 ]] || die "no gpu-labelled test and no *_gpu_bench in ${build_dir}"

echo "bundle.sh: building ${#targets[@]} targets with -j${jobs}: ${targets[*]}"
cmake --build "${build_dir}" -j "${jobs}" --target "${targets[@]}" >"${build_dir}/bundle-build.log" 2>&1 ||
  { tail -30 "${build_dir}/bundle-build.log" >&2; die "build failed (log: ${build_dir}/bundle-build.log)"; }

rm -rf "${bundle}"
mkdir -p "${bundle}/tests" "${bundle}/bench" "${bundle}/lib" "${bundle}/lib-fallback"
binaries=()

# Tests, with their ctest arguments.
while IFS=$'\t' read -r -a fields; do
  name="${fields[0]}"
  binary="${fields[1]:-}"
  [[ -n "${binary}" && -x "${binary}" ]] || die "gpu test ${name}: its binary was not built"
  strip --strip-unneeded -o "${bundle}/tests/${name}" "${binary}"
  if [[ ${#fields[@]} -gt 2 ]]; then
    printf '%s\n' "${fields[@]:2}" >"${bundle}/tests/${name}.args"
  fi
  binaries+=("${bundle}/tests/${name}")
done < <(python3 "${root}/perf/gpu/list_gpu_tests.py" "${build_dir}")

while read -r binary; do
  strip --strip-unneeded -o "${bundle}/bench/$(basename "${binary}")" "${binary}"
  binaries+=("${bundle}/bench/$(basename "${binary}")")
done < <(find "${build_dir}/perf" -name '*_gpu_bench' -type f -perm -u+x | sort)

# Libraries, by what ldd resolves for each binary.
is_c_runtime() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
      librt.so.* | libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
is_external() {  # the driver's, or in the GPU image's nvidia-* wheels
  case "$1" in
    libcuda.so.* | libnvidia-*.so* | libnccl.so.* | libcublas.so.* | libcublasLt.so.*) return 0 ;;
  esac
  return 1
}
declare -A bundled=() external=()
for binary in "${binaries[@]}"; do
  while read -r soname arrow path _; do
    [[ "${arrow}" == "=>" ]] || continue
    [[ "${path}" != "not" ]] || die "$(basename "${binary}") needs ${soname}, which ldd does not find here"
    if is_c_runtime "${soname}"; then
      continue
    elif is_external "${soname}"; then
      external["${soname}"]=1
    elif [[ "${soname}" == libstdc++.so.* ]]; then
      [[ -e "${bundle}/lib-fallback/${soname}.gz" ]] ||
        gzip -9 -c "$(readlink -f "${path}")" >"${bundle}/lib-fallback/${soname}.gz"
    elif [[ -z "${bundled[${soname}]:-}" ]]; then
      bundled["${soname}"]=1
      real=$(readlink -f "${path}")
      if [[ $(stat -c %s "${real}") -gt 1048576 ]]; then
        gzip -9 -c "${real}" >"${bundle}/lib/${soname}.gz"
      else
        cp "${real}" "${bundle}/lib/${soname}"
      fi
    fi
  done < <(ldd "${binary}")
done
printf '%s\n' "${!external[@]}" | sort >"${bundle}/external.txt"

# The newest symbol versions the binaries and bundled libraries need: check.sh
# compares them with the GPU machine's glibc and libstdc++.
newest() {
  local pattern="$1"
  shift
  for f in "$@"; do
    case "${f}" in
      *.gz) gzip -dc "${f}" >"${bundle}/.probe" && objdump -T "${bundle}/.probe" ;;
      *) objdump -T "${f}" ;;
    esac
  done 2>/dev/null | grep -o "${pattern}[0-9.]*" | sort -uV | tail -1
  rm -f "${bundle}/.probe"
}
libs=("${bundle}"/lib/*)
{
  echo "commit $(git -C "${root}" rev-parse --short HEAD)$(git -C "${root}" diff --quiet HEAD -- || echo '+dirty')"
  # shellcheck source=/dev/null
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "${PRETTY_NAME}"), $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'nvcc ?')"
  echo "cuda_architectures 90"
  echo "needs_glibc $(newest 'GLIBC_2\.' "${binaries[@]}" "${libs[@]}" | sed 's/GLIBC_//')"
  echo "needs_glibcxx $(newest 'GLIBCXX_3\.4\.' "${binaries[@]}" "${libs[@]}" | sed 's/GLIBCXX_//')"
} >"${bundle}/MANIFEST"

bytes=$(du -sb "${bundle}" | cut -f1)
mib=$(awk -v b="${bytes}" 'BEGIN { printf "%.1f", b / 1048576 }')
echo
echo "bundle.sh: ${bundle#"${root}"/}: ${mib} MiB"
cat "${bundle}/MANIFEST"
echo "tests:     $(cd "${bundle}/tests" && find . -type f ! -name '*.args' -printf '%f\n' | sort | tr '\n' ' ')"
echo "benches:   $(cd "${bundle}/bench" && find . -type f -printf '%f\n' | sort | tr '\n' ' ')"
echo "libraries (bytes):"
(cd "${bundle}" && find lib lib-fallback -type f -printf '  %p %s\n' | sort)
echo "external:  $(tr '\n' ' ' <"${bundle}/external.txt")(check.sh finds them in the GPU image's nvidia-* wheels)"
if [[ "${bytes}" -gt $((max_mib * 1048576)) ]]; then
  die "the bundle is ${mib} MiB, over the ${max_mib} MiB limit (--max-mib)"
fi
echo "bundle.sh: ok; on the GPU machine: bash perf/gpu/check.sh (carry perf/gpu/bundle)"
