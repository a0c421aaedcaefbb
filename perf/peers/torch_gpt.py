"""The PyTorch side of perf/peers/gpt_side_by_side.sh: Hugging Face's
GPT2LMHeadModel, built from the GPT trainer's config.json, trained on the
CPU with PyTorch DDP, PyTorch FSDP2 (fully_shard) or DeepSpeed ZeRO-1 / ZeRO-3,
one process per rank over gloo, one compute thread per process.

Launched by gpt_side_by_side.sh through the venv's torchrun (DeepSpeed too:
deepspeed.init_distributed reads torchrun's environment):

  torchrun --standalone --nproc-per-node N perf/peers/torch_gpt.py \
      --framework ddp|fsdp2|ds1|ds3 --config config.json --data text.txt \
      --micro-batch 8 --seq 128 --steps 20 --precision fp32,bf16 \
      --json out_{prec}.json [--split-json split_{prec}.json]

One launch makes one measurement per precision (each from a fresh model, the
same seed), then with --split-json an instrumented one per precision: the
process and import start-up (seconds; tens of them for DeepSpeed under load)
is paid once.

Model: GPT2LMHeadModel(GPT2Config.from_json_file(--config)) with every dropout
set to 0 and no KV cache (the zeroshard trainer has neither), the head tied
to the token embedding (HF's default), HF's default attention implementation
(printed in the JSON). The loss is the mean cross-entropy of the logits at
every position against the next byte.

Data: the bytes of --data as tokens (vocab 256). The file is cut into
non-overlapping windows of seq + 1 bytes; a permutation of the windows from
--seed orders them, and step s of rank r takes the micro-batch of windows
[(s * world + r) * B, (s * world + r + 1) * B) of it (wrapping around): the
ranks' windows are disjoint and every framework reads the same ones. All
batches are made before the timed loop.

Training, gpt_train's defaults: AdamW (lr 1e-3, betas 0.9 / 0.999, eps
1e-8, weight decay 0.1 on the matmul weights of the blocks only; biases,
LayerNorms and both embeddings no decay, as nanoGPT and gpt_train group
them), linear warm-up over 5% of the steps then cosine to 10% of the lr,
clipping at global norm 1.0. fused=True where this torch has a CPU fused
AdamW (the JSON says which). bf16: the forward and the loss under
torch.autocast("cpu", dtype=torch.bfloat16); params, gradients and optimizer
stay fp32 (for DeepSpeed too: its own "bf16" mode keeps bf16 params and
gradients with an fp32 master, a different recipe; gpt_train's bf16 is that
one). DeepSpeed: torch.optim.AdamW as the client optimizer
("zero_allow_untested_optimizer"; DeepSpeedCPUAdam would need its C++ op
compiled at run time), its own gradient_clipping, ZeRO's other settings at
their defaults. (DeepSpeed on the CPU accelerator JIT-compiles its
shared-memory all-reduce op, used by inference only, the first time it
starts: minutes, once, cached in ~/.cache/torch_extensions, outside any
timed step.)

A step is timed from zero_grad to the end of optimizer.step() and the LR
scheduler (DDP's backward waits for its all-reduce, FSDP2's forward and
backward include their all-gathers and reduce-scatters, DeepSpeed's step its
all-gather of the updated partitions). Rank 0 writes the JSON: every rank's
per-step times (ms), their median after --warmup steps, the slowest rank's
median, tokens per second of the whole step (world * B * seq tokens).

--split-json: an instrumented run for the step-time split. A barrier closes each
phase (forward + loss, backward, optimizer = clipping + step + scheduler +
zero_grad), so a phase's time is the slowest rank's. For DDP, every other
step runs its backward under no_sync() (no all-reduce): the median
backward with the all-reduce less the median without it is the exposed
communication. For FSDP2 and DeepSpeed the collectives run inside the
phases (FSDP2: all-gathers in forward and backward, reduce-scatters in
backward; ZeRO-1: the reduction in backward and the all-gather in the
optimizer step; ZeRO-3: all-gathers in forward and backward), and the split
says so. The barriers cost time: the split's total is not the step time of
the plain run, which is the one quoted as tokens/s.
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=["ddp", "fsdp2", "ds1", "ds3"], required=True)
    ap.add_argument("--config", required=True, help="HF GPT-2 config.json")
    ap.add_argument("--data", required=True, help="text file, read as bytes")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--precision", default="fp32",
                    help="fp32, bf16, or a comma list (one measurement each, in order)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", required=True,
                    help="rank 0 writes each plain measurement here ({prec}: its precision)")
    ap.add_argument("--split-json", default="",
                    help="also an instrumented measurement per precision (barriers per phase), "
                    "after the plain ones, written here ({prec}: its precision)")
    return ap.parse_args()


def fused_cpu_adamw_works(torch):
    try:
        p = torch.nn.Parameter(torch.zeros(8))
        p.grad = torch.ones(8)
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def warmup_cosine(steps):
    warmup = max(1, steps // 20)

    def factor(step):
        s = step + 1
        if s <= warmup:
            return s / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_batches(torch, path, seq, micro_batch, steps, world, rank, seed):
    with open(path, "rb") as f:
        data = f.read()
    n_windows = (len(data) - 1) // seq
    if n_windows < 1:
        raise SystemExit("torch_gpt.py: %s has %d bytes: fewer than one window of seq + 1 = %d"
                         % (path, len(data), seq + 1))
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)
    order = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed))
    xs, ys = [], []
    for s in range(steps):
        first = (s * world + rank) * micro_batch
        idx = order[[(first + b) % n_windows for b in range(micro_batch)]]
        win = torch.stack([tokens[i * seq:i * seq + seq + 1] for i in idx.tolist()])
        xs.append(win[:, :-1].contiguous())
        ys.append(win[:, 1:].contiguous())
    return xs, ys, n_windows


def param_groups(model, weight_decay):
    """Decay on the blocks' 2-D matmul weights only (nanoGPT's grouping, the
    zeroshard trainer's): biases, LayerNorms, wte (hence the tied head), wpe
    no decay."""
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() == 2 and ".h." in "." + name and "wte" not in name and "wpe" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def main():
    args = parse_args()
    if args.framework.startswith("ds"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers

    torch.set_num_threads(args.threads)
    if args.framework.startswith("ds"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    transformers.logging.set_verbosity_error()  # bos/eos 50256 outside a byte vocab: unused
    cfg = transformers.GPT2Config.from_json_file(args.config)
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    cfg.use_cache = False
    # GPT-2's defaults (50256) lie outside a byte vocabulary; unused here.
    for tok in ("bos_token_id", "eos_token_id"):
        if getattr(cfg, tok, None) is not None and getattr(cfg, tok) >= cfg.vocab_size:
            setattr(cfg, tok, None)
    if args.seq > cfg.n_positions:
        raise SystemExit("torch_gpt.py: --seq %d > n_positions %d in %s"
                         % (args.seq, cfg.n_positions, args.config))
    xs, ys, n_windows = make_batches(torch, args.data, args.seq, args.micro_batch, args.steps,
                                     world, rank, args.seed)
    vocab = cfg.vocab_size
    if int(max(x.max() for x in xs)) >= vocab:
        raise SystemExit("torch_gpt.py: a byte >= vocab_size %d in %s" % (vocab, args.data))
    fused_works = fused_cpu_adamw_works(torch)
    precisions = args.precision.split(",")
    for prec in precisions:
        if prec not in ("fp32", "bf16"):
            raise SystemExit("torch_gpt.py: --precision %s: fp32 or bf16" % prec)
    plan = [(prec, False, args.json) for prec in precisions]
    if args.split_json:
        plan += [(prec, True, args.split_json) for prec in precisions]
    for prec, split, path in plan:
        measure(args, torch, dist, F, transformers, cfg, xs, ys, n_windows, fused_works, prec,
                split, path.replace("{prec}", prec))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def measure(args, torch, dist, F, transformers, cfg, xs, ys, n_windows, fused, precision, split,
            json_path):
    """One measurement: a fresh model from the seed, wrapped by the framework,
    trained --steps steps; rank 0 writes json_path."""
    rank, world = dist.get_rank(), dist.get_world_size()
    vocab = cfg.vocab_size
    torch.manual_seed(args.seed)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    attn_impl = getattr(model.config, "_attn_implementation", None)
    params = sum(p.numel() for p in model.parameters())  # tied head counted once
    opt_kwargs = {"lr": args.lr, "betas": (0.9, 0.999), "eps": 1e-8}
    if fused:
        opt_kwargs["fused"] = True
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) \
        if precision == "bf16" else contextlib.nullcontext

    def loss_of(m, x, y):
        with autocast():
            logits = m(input_ids=x).logits
            return F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

    no_sync = None
    ds_engine = None
    if args.framework == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model)
        no_sync = wrapped.no_sync
        opt = torch.optim.AdamW(param_groups(model, args.weight_decay), **opt_kwargs)
    elif args.framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
        # The params are now DTensors (each rank's shard); fused AdamW takes them.
        opt = torch.optim.AdamW(param_groups(model, args.weight_decay), **opt_kwargs)
    else:
        import deepspeed

        stage = 1 if args.framework == "ds1" else 3
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": 1,
            "train_batch_size": args.micro_batch * world,
            "gradient_clipping": args.clip,
            "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage},
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }
        opt = torch.optim.AdamW(param_groups(model, args.weight_decay), **opt_kwargs)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.steps))
        ds_engine, opt, _, sched = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=ds_config)
        wrapped = ds_engine
    if ds_engine is None:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.steps))

    def forward(step):
        return loss_of(wrapped, xs[step], ys[step])

    def backward(loss):
        if ds_engine is not None:
            ds_engine.backward(loss)
        else:
            loss.backward()

    def optimizer_step():
        if ds_engine is not None:
            ds_engine.step()  # clipping, step, scheduler, zero_grad
            return
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    dist.barrier()
    times_ms, losses, phases = [], [], []
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for step in range(args.steps):
        if not split:
            start = time.perf_counter()
            loss = forward(step)
            backward(loss)
            optimizer_step()
            times_ms.append((time.perf_counter() - start) * 1e3)
        else:
            # DDP: every other backward without its all-reduce. The ranks'
            # weights then drift apart; only this run's times are used.
            local = no_sync is not None and step % 2 == 1
            t0 = time.perf_counter()
            loss = forward(step)
            dist.barrier()
            t1 = time.perf_counter()
            with (no_sync() if local else contextlib.nullcontext()):
                backward(loss)
            dist.barrier()
            t2 = time.perf_counter()
            optimizer_step()
            dist.barrier()
            t3 = time.perf_counter()
            times_ms.append((t3 - t0) * 1e3)
            phases.append({"forward": (t1 - t0) * 1e3, "backward": (t2 - t1) * 1e3,
                           "optimizer": (t3 - t2) * 1e3, "no_sync": local})
        losses.append(float(loss.item()))
    cpu_per_wall = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)

    timed = times_ms[args.warmup:] if len(times_ms) > args.warmup else times_ms
    mine = {
        "rank": rank,
        "step_ms": times_ms,
        "median_ms": statistics.median(timed),
        "mean_all_ms": statistics.fmean(times_ms),
        "cpu_per_wall": cpu_per_wall,
        "torch_threads": torch.get_num_threads(),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "losses": losses,
    }
    if split:
        ph = phases[args.warmup:] if len(phases) > args.warmup else phases
        synced = [p for p in ph if not p["no_sync"]]
        sp = {k: statistics.median(p[k] for p in synced)
              for k in ("forward", "backward", "optimizer")}
        if no_sync is not None:
            local = [p for p in ph if p["no_sync"]]
            if local:
                bwd_local = statistics.median(p["backward"] for p in local)
                sp["backward_compute"] = bwd_local
                sp["exposed_comm"] = max(0.0, sp["backward"] - bwd_local)
        mine["split"] = sp
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        median_ms = max(r["median_ms"] for r in every)
        result = {
            "side": args.framework,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "fused_adamw": fused,
            "attn_implementation": attn_impl,
            "threads_per_rank": args.threads,
            "ranks": world,
            "micro_batch": args.micro_batch,
            "seq": args.seq,
            "steps": args.steps,
            "warmup": args.warmup,
            "precision": precision,
            "params": params,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
            "n_positions": cfg.n_positions, "vocab_size": cfg.vocab_size,
            "windows": n_windows,
            "split_run": split,
            "median_ms": median_ms,
            "mean_all_ms": max(r["mean_all_ms"] for r in every),
            "tokens_per_s": world * args.micro_batch * args.seq / (median_ms / 1e3),
            "per_rank": every,
        }
        if ds_engine is not None:
            import deepspeed

            result["deepspeed"] = deepspeed.__version__
            result["zero_stage"] = 1 if args.framework == "ds1" else 3
            result["ds_optimizer"] = "torch.optim.AdamW" + (" (fused)" if fused else "")
        if split:
            # Each phase ends on a barrier, so every rank sees the same phase
            # ends; take the largest over ranks (they differ only by noise).
            result["split"] = {k: max(r["split"][k] for r in every) for k in every[0]["split"]}
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    dist.barrier()



if __name__ == "__main__":
    sys.exit(main())
