#!/usr/bin/env python3
"""Lists the ctest tests labelled `gpu` in a build tree, for bundle.sh and
check.sh --build-dir.

  list_gpu_tests.py BUILD_DIR          NAME<TAB>BINARY[<TAB>ARG...] per test
  list_gpu_tests.py BUILD_DIR --names  NAME per test (works before a build)

Tests whose binary is a *_gpu_bench are left out: check.sh runs those as
benchmarks. Exits 1 with a message when ctest cannot read the tree.
"""
import json
import os
import subprocess
import sys


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    build_dir, names_only = argv[1], "--names" in argv[2:]
    try:
        listing = subprocess.run(
            ["ctest", "--test-dir", build_dir, "-N", "-L", "gpu", "--show-only=json-v1"],
            check=True, capture_output=True, text=True).stdout
        tests = json.loads(listing).get("tests", [])
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        print(f"list_gpu_tests: cannot list the tests of {build_dir} with ctest: {error}; "
              "configure it first (cmake -S . -B BUILD)", file=sys.stderr)
        return 1
    for test in tests:
        name, command = test["name"], test.get("command") or []
        labels = [p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"]
        if not any("gpu" in value for value in labels):
            continue
        if command and os.path.basename(command[0]).endswith("_gpu_bench"):
            continue
        if name.endswith("_gpu_bench_smoke"):
            continue
        if names_only:
            print(name)
        elif not command:
            # ctest leaves the command out when the binary is not built yet.
            print(f"{name}\t")
        else:
            print("\t".join([name] + command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
