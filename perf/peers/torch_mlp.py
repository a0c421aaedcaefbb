"""The PyTorch side of perf/peers: mlp_demo's model trained with DDP or
DDP + ZeroRedundancyOptimizer over gloo, one process per rank.

Launched by run.sh through the venv's torchrun:

  torchrun --standalone --nproc-per-node N perf/peers/torch_mlp.py \
      --hidden 512 --blocks 8 --micro-batch 32 --steps 20 --optim ddp --json out.json

The model has the shapes and FLOPs of examples/mlp/mlp.h: `blocks` residual
blocks y = x + W2 gelu(W1 x + b1) + b2 on hidden size h (W1 [4h, h], biases
included, exact erf GELU), MSE against a fixed random teacher of the same
architecture on x ~ N(0, 1). The init distribution is PyTorch's default, not
mlp_demo's (it does not change the step time). The training settings follow
mlp_demo's defaults: AdamW lr 3e-3, weight decay 0.01 on weights only (not
biases), warmup (5% of the steps) then cosine decay to 10%, gradient clipping
at global norm 2.0.

Threads: zeroshard's trainer runs one OpenBLAS thread per rank
(examples/mlp/internal/block_math.cc, UseSingleThreadedBlas), so each rank
here calls torch.set_num_threads(--threads, default 1).

Inputs and teacher outputs of every step are generated BEFORE the timed loop
(the peers' table counts no input time: compare with zeroshard's step less
its input wait). A step is timed from zero_grad to the end of
optimizer.step() and the LR scheduler (DDP's backward waits for its
all-reduce buckets, so communication is inside). Rank 0 writes the JSON:
every rank's per-step times (ms), their median after --warmup steps and the
mean over all steps, the torch version and whether fused AdamW was used.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x), approximate="none"))


def make_model(hidden, blocks):
    return nn.Sequential(*[Block(hidden) for _ in range(blocks)])


def param_groups(model, weight_decay):
    """Weight decay on the weight matrices only, as mlp_demo (biases no_decay)."""
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def fused_cpu_adamw_works():
    """True when this torch has a fused AdamW kernel for CPU tensors."""
    try:
        p = nn.Parameter(torch.zeros(8))
        p.grad = torch.ones(8)
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def warmup_cosine(steps):
    """mlp_demo's schedule: linear warmup over 5% of the steps, cosine to 10%."""
    warmup = max(1, steps // 20)

    def factor(step):  # step = optimizer steps already taken
        s = step + 1
        if s <= warmup:
            return s / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--optim", choices=["ddp", "zero"], default="ddp",
                    help="ddp: DDP + AdamW; zero: DDP + ZeroRedundancyOptimizer(AdamW)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=2.0, help="max global grad norm, 0 = off")
    ap.add_argument("--json", required=True, help="rank 0 writes the result here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # Same initial weights on every rank (DDP would broadcast them anyway).
    torch.manual_seed(1)
    model = make_model(args.hidden, args.blocks)
    torch.manual_seed(2)
    teacher = make_model(args.hidden, args.blocks).requires_grad_(False)

    # Every step's data, made before timing: rank r's micro-batch of step s.
    gen = torch.Generator().manual_seed(3 + 1000 * rank)
    with torch.no_grad():
        xs = [torch.randn(args.micro_batch, args.hidden, generator=gen) for _ in range(args.steps)]
        ys = [teacher(x) for x in xs]
    del teacher

    ddp = DDP(model)
    fused = fused_cpu_adamw_works()
    opt_kwargs = {"lr": args.lr, "fused": True} if fused else {"lr": args.lr}
    groups = param_groups(ddp.module, args.weight_decay)
    if args.optim == "ddp":
        opt = torch.optim.AdamW(groups, **opt_kwargs)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Its constructor takes one param list; the no-decay group is added
        # after (add_param_group re-partitions across ranks).
        opt = ZeroRedundancyOptimizer(
            groups[0]["params"], optimizer_class=torch.optim.AdamW,
            weight_decay=args.weight_decay, **opt_kwargs)
        opt.add_param_group(groups[1])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.steps))

    dist.barrier()
    times_ms, losses = [], []
    # Process CPU time over wall time of the loop: about 1 when the compute
    # ran on one thread (gloo's own threads add a little), the check that
    # the thread setting held.
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for step in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(xs[step]), ys[step])
        loss.backward()
        if args.clip > 0:
            # DDP's grads are already all-reduced: the local norm is global.
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip)
        opt.step()
        sched.step()
        times_ms.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())

    cpu_per_wall = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    timed = times_ms[args.warmup:] if len(times_ms) > args.warmup else times_ms
    mine = {
        "rank": rank,
        "step_ms": times_ms,
        "median_ms": statistics.median(timed),
        "mean_all_ms": statistics.fmean(times_ms),
        "torch_threads": torch.get_num_threads(),
        "cpu_per_wall": cpu_per_wall,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        params = sum(p.numel() for p in ddp.module.parameters())
        result = {
            "side": "pytorch",
            "torch": torch.__version__,
            "optim": args.optim,
            "fused_adamw": fused,
            "threads_per_rank": args.threads,
            "ranks": world,
            "hidden": args.hidden,
            "blocks": args.blocks,
            "micro_batch": args.micro_batch,
            "steps": args.steps,
            "warmup": args.warmup,
            "params": params,
            # The step is synchronous across ranks (DDP's all-reduce): quote
            # the slowest rank's median.
            "median_ms": max(r["median_ms"] for r in every),
            "mean_all_ms": max(r["mean_all_ms"] for r in every),
            "per_rank": every,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    # Every rank past its last collective before gloo is torn down: a rank
    # that tears down while a peer still talks to it can abort at exit.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
