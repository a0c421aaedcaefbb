#!/usr/bin/env bash
# The layer rules of docs/architecture.md ("Layers"), checked on every
# #include of the tree (ctest: packaging_include_check, so `make test` runs
# it). Exit 1, listing every violation as file:line, the include and the
# rule it breaks; exit 0 when there is none.
#
#   include_check.sh SOURCE_DIR [INSTALLED_KERNEL_HEADER...]
#
# INSTALLED_KERNEL_HEADER: the kernels/ headers that cmake/zs_install.cmake
# installs beside the public API (ZS_KERNELS_PUBLIC_HDRS in
# kernels/CMakeLists.txt); examples may include those and no other kernel.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 SOURCE_DIR [INSTALLED_KERNEL_HEADER...]" >&2
  exit 2
fi
root=$1
shift
installed_kernels=" $* "
kernel_list=${*:-none}
cd "$root"

violations=0
checked=0

# report FILE:LINE INCLUDE RULE
report() {
  echo "include_check: $1: #include \"$2\": $3"
  violations=$((violations + 1))
}

# Every #include "x" or <x> of the C++ and CUDA files under the given
# folders, as FILE:LINE:PATH.
includes() {
  local dir
  for dir in "$@"; do
    [ -d "$dir" ] || continue
    find "$dir" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) \
      -print0 | sort -z | xargs -0 -r grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' |
      sed -E 's/^([^:]+:[0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*/\1:\2/'
  done
}

public_only="tools/, examples/, perf/ and cli/ include the public API (engine/include/zeroshard/), never engine/src; grow the public API or move the code (docs/architecture.md, Layers)"
while IFS=: read -r file line path; do
  checked=$((checked + 1))
  case $path in
    engine/src/*) report "$file:$line" "$path" "$public_only" ;;
  esac
done < <(includes tools examples perf cli)

while IFS=: read -r file line path; do
  case $path in
    kernels/*)
      if [[ $installed_kernels != *" $path "* ]]; then
        report "$file:$line" "$path" "examples include installed headers only: zeroshard/ and the installed kernel headers (${kernel_list}); link zeroshard::engine and use the public API"
      fi
      ;;
  esac
done < <(includes examples)

while IFS=: read -r file line path; do
  checked=$((checked + 1))
  case $path in
    engine/* | zeroshard/*)
      report "$file:$line" "$path" "kernels/ includes nothing of the engine (engine/src, zeroshard/): the engine calls the kernels, never the other way"
      ;;
  esac
done < <(includes kernels)

while IFS=: read -r file line path; do
  case $path in
    kernels/cpu/* | kernels/cuda/* | kernels/common/*)
      report "$file:$line" "$path" "kernels/reference depends on nothing it judges (no kernels/cpu, kernels/cuda or kernels/common)"
      ;;
  esac
done < <(includes kernels/reference)

while IFS=: read -r file line path; do
  checked=$((checked + 1))
  case $path in
    engine/* | kernels/* | tools/* | examples/* | perf/* | cli/* | tests/*)
      report "$file:$line" "$path" "a public header includes only zeroshard/ headers, abseil and the standard library (it is installed alone)"
      ;;
  esac
done < <(includes engine/include)

while IFS=: read -r file line path; do
  checked=$((checked + 1))
  case $path in
    engine/src/device/* | engine/src/comm/* | engine/src/runtime/* | engine/src/checkpoint/* | kernels/*)
      report "$file:$line" "$path" "the planner and the layout are pure: no device, communicator, runtime, checkpoint or kernel (zeroshard estimate runs on any laptop)"
      ;;
  esac
done < <(includes engine/src/plan engine/src/layout)

while IFS=: read -r file line path; do
  checked=$((checked + 1))
  case $path in
    engine/src/device/cuda_device.h | engine/src/runtime/*)
      report "$file:$line" "$path" "comm/ uses the device layer's interface (zeroshard/device.h, engine/src/device/scoped_cuda_device.h), not the CUDA device's internals or the runtime"
      ;;
  esac
done < <(includes engine/src/comm)

if [ "$violations" -ne 0 ]; then
  echo "include_check: FAILED: $violations include(s) break the layer rules"
  exit 1
fi
echo "include_check: OK ($checked includes checked)"
