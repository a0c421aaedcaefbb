"""The PyTorch side of perf/peers' AdamW comparison: torch.optim.AdamW on one
fp32 CPU tensor of N elements (default 64M, as perf/kernels/adam_bench), with
fused=True where this torch has a fused CPU kernel (else foreach, recorded),
and the roofline measured in the same process: a copy of the same bytes.

Bytes are counted as adam_bench counts them (perf/kernels/adam_bench.cc):
an fp32 AdamW update moves 28 B per element (param r+w 8, grad r 4, m r+w 8,
v r+w 8); the copy baseline for those bytes copies 14 B per element from one
buffer to another (read 14 + write 14). GB/s = 1e9 bytes per second.

For each thread count (torch.set_num_threads) it prints and records
  - best and median GB/s of the update, of the copies (torch copy_ and
    numpy copyto) and of a read-modify-write stream (p += g, 12 B per element,
    its time scaled by 28/12), each over --iters timed runs after two warm-ups;
  - the paired ratio, as adam_bench's second table: copy and update
    alternate --pairs times, each pair gives t_copy / t_update; median, min,
    max (both halves of a pair see the same machine).
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

UPDATE_BYTES_PER_ELEM = 28  # fp32 AdamW, as adam_bench
COPY_BYTES_PER_ELEM = 14  # copied per element so that read + write = 28


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=64 << 20, help="elements (default 64M)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    n = args.n
    # Magnitudes like adam_bench's (no subnormals).
    r = torch.rand(n, dtype=torch.float32) - 0.5
    param = torch.nn.Parameter(0.05 * r)
    param.grad = 1e-3 * r + 1e-6
    del r
    fused = True
    try:
        opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, fused=True)
        opt.step()  # creates m and v; fails here when there is no fused CPU kernel
    except (RuntimeError, TypeError, ValueError):
        fused = False
        opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, foreach=True)
        opt.step()
    copy_floats = n * COPY_BYTES_PER_ELEM // 4
    src = torch.ones(copy_floats, dtype=torch.float32)
    dst = torch.zeros(copy_floats, dtype=torch.float32)
    src_np, dst_np = src.numpy(), dst.numpy()

    update_bytes = float(UPDATE_BYTES_PER_ELEM * n)

    def gbps(t):
        return update_bytes / t / 1e9

    def update():
        opt.step()

    def copy_torch():
        dst.copy_(src)

    def copy_numpy():
        np.copyto(dst_np, src_np)

    # Read-modify-write stream: param += grad moves 12 B per element (p r+w,
    # g r); timed over those bytes and scaled to the update's, so its GB/s is
    # comparable with the others.
    rmw_scale = UPDATE_BYTES_PER_ELEM / 12.0
    rmw_src = torch.empty(n, dtype=torch.float32).fill_(1e-7)

    def rmw_torch():
        param.data.add_(rmw_src)

    results = []
    for threads in [int(t) for t in args.threads.split(",") if t]:
        torch.set_num_threads(threads)
        row = {"threads": threads}
        for name, fn in (("update", update), ("copy_torch", copy_torch), ("copy_numpy", copy_numpy),
                         ("rmw_torch", rmw_torch)):
            fn()
            fn()
            ts = [seconds(fn) for _ in range(args.iters)]
            if name == "rmw_torch":
                ts = [t * rmw_scale for t in ts]
            row[name + "_best_gbps"] = gbps(min(ts))
            row[name + "_median_gbps"] = gbps(statistics.median(ts))
        ratios = []
        for _ in range(args.pairs):
            t_copy = seconds(copy_torch)
            t_update = seconds(update)
            ratios.append(t_copy / t_update)
        ratios.sort()
        row["paired_ratio_median"] = ratios[len(ratios) // 2]
        row["paired_ratio_min"] = ratios[0]
        row["paired_ratio_max"] = ratios[-1]
        results.append(row)
        print(
            "torch AdamW (%s) %d thread%s: best %.2f GB/s, median %.2f; copy_ best %.2f, "
            "numpy copyto best %.2f (numpy is single-threaded), p += g best %.2f; "
            "paired update/copy %.3f"
            % ("fused" if fused else "foreach", threads, "" if threads == 1 else "s",
               row["update_best_gbps"], row["update_median_gbps"], row["copy_torch_best_gbps"],
               row["copy_numpy_best_gbps"], row["rmw_torch_best_gbps"], row["paired_ratio_median"]),
            flush=True)

    with open(args.json, "w") as f:
        json.dump({"side": "pytorch", "torch": torch.__version__, "fused_adamw": fused,
                   "impl": "fused" if fused else "foreach", "n": n,
                   "bytes_per_elem": UPDATE_BYTES_PER_ELEM, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
