#!/usr/bin/env python3
"""PyTorch's forward + backward of the MLP example's model, for comparison
with perf/examples/mlp_block_bench at the same shapes and threads.

The model is examples/mlp's: `blocks` residual blocks
y = x + W2 gelu(W1 x + b1) + b2 (exact erf GELU), MSE loss, fp32, one
micro-batch of `micro_batch` samples; no optimizer. One intra-op thread
(torch.set_num_threads(1)), as the example's one BLAS thread per rank.

Prints, as medians over --iters iterations after --warmup: thread CPU ms
and wall ms per forward + backward, with gradients set to None before each
backward (PyTorch's default zero_grad: fresh gradient tensors) and with
gradients kept (accumulated into, as a trainer with grad accumulation).

  build/perf/peers-venv/bin/python perf/examples/torch_mlp_block.py --hidden 512 --blocks 8 \\
      --micro-batch 32
"""
import argparse
import json
import statistics
import time

import torch


class Block(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate="none"))


def time_steps(model, x, target, iters, warmup, keep_grads):
    cpu, wall = [], []
    for i in range(warmup + iters):
        if not keep_grads:
            model.zero_grad(set_to_none=True)
        c0, w0 = time.thread_time(), time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        c1, w1 = time.thread_time(), time.perf_counter()
        if i >= warmup:
            cpu.append((c1 - c0) * 1e3)
            wall.append((w1 - w0) * 1e3)
    return statistics.median(cpu), statistics.median(wall)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.hidden) for _ in range(args.blocks)])
    x = torch.randn(args.micro_batch, args.hidden)
    target = torch.randn(args.micro_batch, args.hidden)
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "hidden": args.hidden,
        "blocks": args.blocks,
        "micro_batch": args.micro_batch,
        "params": sum(p.numel() for p in model.parameters()),
    }
    for keep in (False, True):
        cpu, wall = time_steps(model, x, target, args.iters, args.warmup, keep)
        key = "grads_kept" if keep else "grads_none"
        result[key] = {"cpu_ms": cpu, "wall_ms": wall}
    print(
        "torch %s, %d thread(s), %d blocks x hidden %d, micro-batch %d (%d params): forward + "
        "backward, median of %d" % (result["torch"], result["threads"], args.blocks, args.hidden,
                                    args.micro_batch, result["params"], args.iters))
    for key in ("grads_none", "grads_kept"):
        print("  %-11s thread CPU %8.3f ms   wall %8.3f ms" %
              (key, result[key]["cpu_ms"], result[key]["wall_ms"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
