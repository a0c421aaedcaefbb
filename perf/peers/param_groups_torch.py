"""The PyTorch side of perf/peers/param_groups.sh: repeats the run that
param_groups_driver wrote (meta.json, init.f32, grads.f32) with
torch.optim.AdamW and the same param groups, and compares its params after
the last step with the engine's (final.f32).

Each group's learning rate is set before every step as torch trainers do
with a scheduler: lr_group = schedule(step) * lr_scale, with the schedule
computed here from meta.json's formula (warm-up linear from 0, then cosine
to min_lr_ratio * lr) and checked against the rate the engine reported.
Runs torch's default CPU AdamW (the for-loop implementation) and, where
this torch has it, fused=True; and a float64 NumPy AdamW with the same
rule as a referee. Prints the max abs difference of the params per group
and overall, and writes them to --json.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch


def schedule(meta, step):
    """The learning rate of 1-based step `step` (zeroshard's LrSchedule::LrAt)."""
    s = meta["schedule"]
    peak = meta["optimizer"]["lr"]
    warmup, total, ratio = s["warmup_steps"], s["total_steps"], s["min_lr_ratio"]
    if step <= warmup:
        return peak * step / warmup
    min_lr = peak * ratio
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (peak - min_lr) * (1.0 + math.cos(math.pi * progress))


def load(run_dir):
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    sizes = [p["numel"] for p in meta["params"]]
    total = sum(sizes)
    init = np.fromfile(os.path.join(run_dir, "init.f32"), dtype=np.float32)
    grads = np.fromfile(os.path.join(run_dir, "grads.f32"), dtype=np.float32)
    final = np.fromfile(os.path.join(run_dir, "final.f32"), dtype=np.float32)
    steps = meta["steps"]
    assert init.size == total and final.size == total and grads.size == total * steps, \
        "param_groups_driver's files do not match its meta.json"
    return meta, sizes, init, grads.reshape(steps, total), final


def torch_run(meta, sizes, init, grads, fused):
    o = meta["optimizer"]
    offsets = np.cumsum([0] + sizes)
    params = [torch.nn.Parameter(torch.from_numpy(init[offsets[k]:offsets[k + 1]].copy()))
              for k in range(len(sizes))]
    names = list(meta["groups"].keys())
    groups = []
    for name in names:
        g = meta["groups"][name]
        groups.append({"params": [params[k] for k, p in enumerate(meta["params"])
                                  if p["group"] == name],
                       "lr": o["lr"] * g["lr_scale"], "weight_decay": g["weight_decay"],
                       "lr_scale": g["lr_scale"]})
    kwargs = {"betas": (o["beta1"], o["beta2"]), "eps": o["eps"]}
    if fused:
        kwargs["fused"] = True
    opt = torch.optim.AdamW(groups, **kwargs)
    for step in range(meta["steps"]):
        lr = schedule(meta, step + 1)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        for k, p in enumerate(params):
            p.grad = torch.from_numpy(grads[step, offsets[k]:offsets[k + 1]].copy())
        opt.step()
    return np.concatenate([p.detach().numpy() for p in params])


def float64_run(meta, sizes, init, grads):
    """AdamW in float64 with torch's group rule, element-wise (the referee)."""
    o = meta["optimizer"]
    b1, b2, eps = o["beta1"], o["beta2"], o["eps"]
    scale = np.concatenate([np.full(n, meta["groups"][p["group"]]["lr_scale"])
                            for n, p in zip(sizes, meta["params"])])
    decay = np.concatenate([np.full(n, meta["groups"][p["group"]]["weight_decay"])
                            for n, p in zip(sizes, meta["params"])])
    p = init.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for step in range(meta["steps"]):
        t = step + 1
        lr = schedule(meta, t) * scale
        g = grads[step].astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p * (1 - lr * decay)
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps)
    return p


def max_abs(a, b, mask=None):
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(d[mask].max() if mask is not None else d.max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="param_groups_driver's --out directory")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta, sizes, init, grads, final = load(args.run_dir)
    lr_gap = max(abs(schedule(meta, s + 1) - meta["lr"][s]) for s in range(meta["steps"]))
    group_of = np.concatenate([np.full(n, p["group"], dtype=object)
                               for n, p in zip(sizes, meta["params"])])
    reference = float64_run(meta, sizes, init, grads)
    sides = {"torch_default": torch_run(meta, sizes, init, grads, fused=False)}
    try:
        sides["torch_fused"] = torch_run(meta, sizes, init, grads, fused=True)
    except (RuntimeError, TypeError, ValueError) as e:
        print("param_groups: torch %s has no fused CPU AdamW (%s); default only"
              % (torch.__version__, str(e).splitlines()[0]))
    rows = []
    label = "two groups" if meta["grouped"] else "one group"
    print("param_groups: %s, %d steps, torch %s; schedule lr vs the engine's: max diff %.3g"
          % (label, meta["steps"], torch.__version__, lr_gap))
    compared = [("zeroshard vs " + k, final, v) for k, v in sides.items()]
    compared += [("zeroshard vs float64", final, reference)]
    compared += [(k + " vs float64", v, reference) for k, v in sides.items()]
    for what, a, b in compared:
        row = {"what": what, "overall": max_abs(a, b)}
        for name in meta["groups"]:
            row[name] = max_abs(a, b, group_of == name)
        rows.append(row)
        per_group = ", ".join("%s %.3g" % (n, row[n]) for n in meta["groups"])
        print("  %-28s max |diff| overall %.3g (%s)" % (what, row["overall"], per_group))
    with open(args.json, "w") as f:
        json.dump({"grouped": meta["grouped"], "steps": meta["steps"], "torch": torch.__version__,
                   "groups": meta["groups"], "schedule": meta["schedule"],
                   "lr_gap": lr_gap, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
