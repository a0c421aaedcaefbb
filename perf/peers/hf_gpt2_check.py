"""The GPT trainer (examples/gpt) held step by step to Hugging Face.

Builds transformers.GPT2LMHeadModel(GPT2Config(...)) from the trainer's
config.json (dropout 0, eager attention), loads the trainer's initial
weights (its --save-init directory; strict: no missing or unexpected key),
trains on exactly the trainer's token batches (its --dump-batches file) with
torch.optim.AdamW in the trainer's two param groups, its warm-up + cosine
schedule (computed here independently, compared with the lr it logged) and
torch.nn.utils.clip_grad_norm_, and prints at every step both losses and
their relative difference, then the final weights' max relative difference
against the trainer's final export (zeroshard export --hf). Run by
perf/peers/hf_gpt2_check.sh, which makes the venv and the trainer's files.

Semantics matched (engine code, read for this script):
  * AdamW: kernels/common/adam_element.h. m = b1 m + (1-b1) g,
    v = b2 v + (1-b2) g^2, p *= 1 - lr wd, p -= lr/(1-b1^t) m /
    (sqrt(v)/sqrt(1-b2^t) + eps): torch.optim.AdamW's formula (torch
    computes m by lerp and divides by sqrt(1-b2^t) where the engine
    multiplies by its inverse: last-bit differences only).
  * Param groups: weight decay only on the matmul weights of each block
    (attn.c_attn.weight, attn.c_proj.weight, mlp.c_fc.weight,
    mlp.c_proj.weight); none on biases, LayerNorms, embeddings (the head is
    the token embedding).
  * Schedule: zeroshard::LrSchedule::LrAt (engine/src/common/train_spec.cc),
    1-based step s: s <= warmup: lr s / warmup; s >= total: min; else
    min + (lr - min)(1 + cos(pi (s - warmup) / (total - warmup))) / 2.
  * Clipping: engine/src/runtime/engine_step.cc uses torch's rule,
    coef = min(1, max_norm / (norm + 1e-6)) on the norm of the mean
    gradient: clip_grad_norm_ does the same.
  * Loss: the mean over every target token of the global batch (the engine
    averages the micro-batch gradients over micro-batches and ranks, each
    of a micro-batch's mean loss, all micro-batches the same size).
"""

import argparse
import json
import math
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True,
                   help="the trainer's --save-init directory (model.safetensors, config.json)")
    p.add_argument("--config", help="config.json (default: the one in --init)")
    p.add_argument("--batches", required=True, help="the trainer's --dump-batches JSONL")
    p.add_argument("--log", required=True, help="the trainer's --log-json JSONL")
    p.add_argument("--final", help="zeroshard export --hf of the trainer's last checkpoint")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--total-steps", type=int, default=0,
                   help="the schedule's total_steps (default: the number of steps)")
    p.add_argument("--min-lr-ratio", type=float, default=0.0)
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--max-grad-norm", type=float, default=0.0, help="0: no clipping")
    p.add_argument("--steps", type=int, default=0, help="steps to compare (default: all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trainer-logits",
                   help="the trainer's --dump-logits JSON ({batch, seq, vocab, tokens: B*T, "
                        "logits: B*T*vocab}), compared with from_pretrained(--final)'s logits")
    p.add_argument("--summary", help="write the figures as JSON here")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    return p.parse_args()


DECAY_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                  "mlp.c_proj.weight")


def lr_at(step, a):
    """zeroshard::LrSchedule::LrAt, written anew."""
    if a.schedule == "constant":
        return a.lr
    if step <= a.warmup:
        return a.lr * step / a.warmup
    lo = a.lr * a.min_lr_ratio
    if step >= a.total_steps:
        return lo
    progress = (step - a.warmup) / (a.total_steps - a.warmup)
    return lo + 0.5 * (a.lr - lo) * (1.0 + math.cos(math.pi * progress))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    # The trainer has no dropout; its config may not say so.
    cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0)
    cfg.setdefault("activation_function", "gelu_new")
    cfg["tie_word_embeddings"] = True
    for key in ("bos_token_id", "eos_token_id"):  # GPT-2's 50256 is past a byte vocabulary
        cfg.setdefault(key, None)
    for key in ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version"):
        cfg.pop(key, None)
    return cfg


def build_model(transformers, cfg):
    config = transformers.GPT2Config(**cfg)
    try:
        return transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    except TypeError:
        config._attn_implementation = "eager"
        return transformers.GPT2LMHeadModel(config)


def max_rel_diff(mine, theirs):
    """Largest over tensors of max|a - b| / max|b| and the tensor; and
    ||a - b|| / ||b|| over all tensors together."""
    worst, where, diff2, norm2 = 0.0, "", 0.0, 0.0
    for name, b in theirs.items():
        a = mine[name].double()
        b = b.double()
        d = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        diff2 += (a - b).pow(2).sum().item()
        norm2 += b.pow(2).sum().item()
        if d > worst:
            worst, where = d, name
    return worst, where, math.sqrt(diff2 / max(norm2, 1e-300))


def main():
    a = parse_args()
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = load_config(a.config or os.path.join(a.init, "config.json"))
    batches = read_jsonl(a.batches)
    log = {int(r["step"]): r for r in read_jsonl(a.log) if "loss" in r}
    steps = a.steps or len(batches)
    if a.total_steps == 0:
        a.total_steps = steps
    if len(batches) < steps:
        sys.exit(f"hf_gpt2_check: {a.batches} holds {len(batches)} steps, {steps} asked")

    model = build_model(transformers, cfg)
    model.train()  # dropout is 0: train mode computes what eval mode does
    init = load_file(os.path.join(a.init, "model.safetensors"))
    init = {k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v.float()
            for k, v in init.items()}
    init.setdefault("lm_head.weight", init["transformer.wte.weight"])  # tied: one tensor
    missing, unexpected = model.load_state_dict(init, strict=True), []
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), \
        "the head is not tied to wte"

    # Also what a user does: from_pretrained of the same directory.
    _, info = transformers.GPT2LMHeadModel.from_pretrained(a.init, output_loading_info=True)
    print(f"from_pretrained({a.init}): missing {info['missing_keys']}, unexpected "
          f"{info['unexpected_keys']}, mismatched {info.get('mismatched_keys', [])}")

    decay, no_decay = [], []
    for name, param in model.named_parameters():  # the tied head appears once, as wte
        (decay if name.endswith(DECAY_SUFFIXES) else no_decay).append(param)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(1, a), betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    print(f"param groups: decay {len(decay)} tensors "
          f"({sum(p.numel() for p in decay)} elements), no decay {len(no_decay)} "
          f"({sum(p.numel() for p in no_decay)})")

    rows_out = []
    if not a.quiet:
        print(f"{'step':>5} {'loss zeroshard':>15} {'loss HF':>15} {'rel diff':>9} "
              f"{'lr':>11} {'lr diff':>8} {'grad norm zs':>13} {'grad norm HF':>13}")
    for s in range(1, steps + 1):
        b = batches[s - 1]
        if int(b["step"]) != s:
            sys.exit(f"hf_gpt2_check: line {s} of {a.batches} is step {b['step']}")
        rows = torch.tensor(b["rows"], dtype=torch.long)
        lr = lr_at(s, a)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=rows[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        loss.backward()
        max_norm = a.max_grad_norm if a.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
        opt.step()
        zs = log.get(s)
        if zs is None:
            sys.exit(f"hf_gpt2_check: {a.log} has no step {s}")
        rel = abs(loss.item() - zs["loss"]) / abs(zs["loss"])
        lr_diff = abs(lr - zs["lr"]) / max(abs(zs["lr"]), 1e-30) if "lr" in zs else float("nan")
        row = dict(step=s, loss_zs=zs["loss"], loss_hf=loss.item(), rel=rel, lr=lr,
                   lr_rel=lr_diff, norm_zs=zs.get("grad_norm", float("nan")), norm_hf=norm)
        rows_out.append(row)
        if not a.quiet:
            print(f"{s:5d} {zs['loss']:15.8f} {loss.item():15.8f} {rel:9.2e} {lr:11.4e} "
                  f"{lr_diff:8.1e} {row['norm_zs']:13.6e} {norm:13.6e}")

    def worst(n):
        part = rows_out[:n]
        return max(r["rel"] for r in part) if part else float("nan")

    summary = dict(steps=steps, max_rel_1_20=worst(20), max_rel_all=worst(steps),
                   max_lr_rel=max(r["lr_rel"] for r in rows_out),
                   max_norm_rel=max(abs(r["norm_hf"] - r["norm_zs"]) / abs(r["norm_zs"])
                                    for r in rows_out))
    print(f"loss rel diff: max {summary['max_rel_1_20']:.2e} over steps 1-{min(20, steps)}, "
          f"{summary['max_rel_all']:.2e} over 1-{steps}; lr max rel diff "
          f"{summary['max_lr_rel']:.1e}; grad norm max rel diff {summary['max_norm_rel']:.2e}")

    if a.final:
        final = load_file(os.path.join(a.final, "model.safetensors"))
        mine = {k: v.detach() for k, v in model.state_dict().items()}
        d, where, l2 = max_rel_diff(mine, {k: v.float() for k, v in final.items()})
        summary.update(final_weights_max_rel=d, final_weights_worst=where,
                       final_weights_rel_l2=l2)
        print(f"final weights vs {a.final}: max rel diff {d:.2e} ({where}; per tensor "
              f"max|hf - zs| / max|zs|), relative L2 difference {l2:.2e}")
        loaded, info = transformers.GPT2LMHeadModel.from_pretrained(
            a.final, output_loading_info=True, attn_implementation="eager")
        loaded.eval()
        keys_ok = not info["missing_keys"] and not info["unexpected_keys"] and not info.get(
            "mismatched_keys")
        summary.update(from_pretrained_missing=list(info["missing_keys"]),
                       from_pretrained_unexpected=list(info["unexpected_keys"]))
        print(f"from_pretrained({a.final}): missing {info['missing_keys']}, unexpected "
              f"{info['unexpected_keys']}: {'ok' if keys_ok else 'FAILED'}; head tied: "
              f"{loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()}")
        if a.trainer_logits:
            with open(a.trainer_logits) as f:
                ref = json.load(f)
            shape = (ref["batch"], ref["seq"])
            rows = torch.tensor(ref["tokens"], dtype=torch.long).reshape(shape)
            want = torch.tensor(ref["logits"], dtype=torch.float64).reshape(*shape, ref["vocab"])
            with torch.no_grad():
                got = loaded(input_ids=rows).logits.double()
            d = ((got - want).abs().max() / want.abs().max()).item()
            summary.update(logits_max_rel=d)
            print(f"logits of from_pretrained({a.final}) vs the trainer's on {tuple(rows.shape)}"
                  f": max rel diff {d:.2e} (max|hf - zs| / max|zs|)")
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
