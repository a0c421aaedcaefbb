"""The measured single-thread GEMM peak that perf/peers/gpt_side_by_side.sh
divides by for MFU: torch.mm at M = N = K = --size (2048) on one thread
(torch.set_num_threads(1)), fp32 and bf16, best of --reps timed products
after one untimed one. FLOPs per product: 2 M N K.

  python perf/peers/gemm_peak.py [--size 2048] [--reps 5] --json out.json

Prints and writes the GFLOP/s of each dtype's best and median product and
the CPU model and torch's BLAS (torch.__config__.show()'s BLAS line); numpy's
sgemm (its bundled OpenBLAS) at the same size as a second fp32 candidate: the
fp32 peak is the better of torch's and numpy's.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.size
    flops = 2.0 * n * n * n
    out = {"size": n, "reps": args.reps, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "cpu": cpu_model()}
    blas = []
    for line in torch.__config__.show().splitlines():
        line = line.strip().lstrip("- ")
        if line.startswith("Intel(R)") or line.startswith("OpenBLAS"):
            blas.append(line.split("(Git Hash")[0].strip())
        for field in line.split(", "):
            if field.startswith("BLAS_INFO="):
                blas.append(field)
    out["torch_blas"] = "; ".join(blas)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        g = torch.Generator().manual_seed(1)
        a = torch.randn(n, n, generator=g).to(dtype)
        b = torch.randn(n, n, generator=g).to(dtype)
        torch.mm(a, b)
        secs = []
        for _ in range(args.reps):
            t = time.perf_counter()
            torch.mm(a, b)
            secs.append(time.perf_counter() - t)
        out[name] = {"best_gflops": flops / min(secs) / 1e9,
                     "median_gflops": flops / statistics.median(secs) / 1e9}
        print("gemm_peak: torch.mm %s %d^3, 1 thread: best %.1f GFLOP/s, median %.1f"
              % (name, n, out[name]["best_gflops"], out[name]["median_gflops"]))
    # numpy's sgemm too (PyPI's numpy bundles its own OpenBLAS, which picks
    # its kernels by CPU; one thread under the caller's OPENBLAS_NUM_THREADS=1):
    # the fp32 peak is the better of the two libraries.
    try:
        import numpy as np

        rng = np.random.default_rng(1)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        a @ b
        secs = []
        for _ in range(args.reps):
            t = time.perf_counter()
            a @ b
            secs.append(time.perf_counter() - t)
        cfg = np.show_config(mode="dicts") or {}
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        out["numpy_fp32"] = {"best_gflops": flops / min(secs) / 1e9,
                             "median_gflops": flops / statistics.median(secs) / 1e9,
                             "blas": "%s %s" % (blas.get("name", "?"), blas.get("version", "")),
                             "threads_env": os.environ.get("OPENBLAS_NUM_THREADS")}
        print("gemm_peak: numpy sgemm %d^3 (%s, OPENBLAS_NUM_THREADS=%s): best %.1f GFLOP/s"
              % (n, out["numpy_fp32"]["blas"], out["numpy_fp32"]["threads_env"],
                 out["numpy_fp32"]["best_gflops"]))
    except Exception as e:  # numpy is optional here: say why, keep torch's figure
        out["numpy_fp32"] = {"error": str(e)}
    out["torch_fp32"] = dict(out["fp32"])
    if out["numpy_fp32"].get("best_gflops", 0) > out["fp32"]["best_gflops"]:
        out["fp32"] = dict(out["numpy_fp32"], source="numpy")
    else:
        out["fp32"]["source"] = "torch"
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
