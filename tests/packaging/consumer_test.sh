#!/usr/bin/env bash
# Builds and runs examples/consumer, an out-of-tree trainer, against this
# build the two ways docs/embedding.md describes:
#   installed   cmake --install into a temporary prefix, then
#               find_package(zeroshard) with CMAKE_PREFIX_PATH=<prefix>
#   subdirectory add_subdirectory(<zeroshard sources>) (tests, benchmarks and
#               examples off: the lean subproject build)
#
#   consumer_test.sh installed|subdirectory CMAKE SOURCE_DIR BUILD_DIR CXX
set -euo pipefail
mode=$1 cmake=$2 source_dir=$3 build_dir=$4 cxx=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

case $mode in
  installed)
    echo "== cmake --install $build_dir --prefix $work/prefix"
    "$cmake" --install "$build_dir" --prefix "$work/prefix" >"$work/install.log"
    configure=(-DCMAKE_PREFIX_PATH="$work/prefix")
    ;;
  subdirectory)
    configure=(-DZEROSHARD_SOURCE_DIR="$source_dir")
    ;;
  *)
    echo "usage: $0 installed|subdirectory CMAKE SOURCE_DIR BUILD_DIR CXX" >&2
    exit 2
    ;;
esac
echo "== cmake -S $source_dir/examples/consumer ${configure[*]}"
"$cmake" -S "$source_dir/examples/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" "${configure[@]}" >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/consumer" -j 2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
if [ "$mode" = subdirectory ]; then
  # The lean build compiles the engine and nothing else.
  for unwanted in gtest benchmark mlp_demo zeroshard_cli engine_test; do
    if grep -q "Built target $unwanted\b" "$work/build.log"; then
      echo "FAIL: the subproject build also built $unwanted"
      exit 1
    fi
  done
fi
echo "== $work/consumer/tiny_trainer"
"$work/consumer/tiny_trainer"
