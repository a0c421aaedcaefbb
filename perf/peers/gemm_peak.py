"""The measured single-thread GEMM peak that perf/peers/gpt_side_by_side.sh
divides by for MFU: torch.mm at M = N = K = --size (2048) on one thread
(torch.set_num_threads(1)), fp32 and bf16, best of --reps timed products
after one untimed one. FLOPs per product: 2 M N K.

  python perf/peers/gemm_peak.py [--size 2048] [--reps 5] --json out.json

Prints and writes the GFLOP/s of each dtype's best and median product and
the CPU model and torch's BLAS (torch.__config__.show()'s BLAS line).
"""

import argparse
import json
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
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
