"""Tables of perf/peers/gpt_side_by_side.sh: tokens/s of the GPT trainer and
of its peers, the ratios, the step-time split and MFU.

  python3 perf/peers/gpt_compare.py RAW_DIR OUT.json

RAW_DIR holds (k = repeat):
  meta.json, gemm_peak.json, lscpu.txt, config.json
  zs_s{stage}_{prec}_r{n}_{k}.txt / .err    gpt_train's stdout and stderr
  {fw}_{prec}_r{n}_{k}.json                 torch_gpt.py (fw: ddp fsdp2 ds1 ds3)
  split_{fw}_{prec}_r{n}.json               torch_gpt.py --split
  *.fail                                    the stderr tail of a failed run

Figures: each run's tokens/s is world * micro-batch * seq over its median
step after the warm-up steps (slowest rank); the table quotes the median over
the repeats. MFU = tokens/s * FLOPs per token / (min(processes, cores) *
the single-thread sgemm peak), FLOPs per token = 6 N + 12 L C T (N the
params less the position embedding, which is a lookup: the tied head's
matmul is counted once through wte; L layers, C n_embd, T seq: the
attention scores and their weighted sum, forward and backward, the causal
mask not discounted). Standard library only (runs with the system python3).
"""

import glob
import json
import os
import re
import statistics
import sys

PEERS = ["ddp", "fsdp2", "ds1", "ds3"]
LABEL = {"ddp": "PyTorch DDP", "fsdp2": "PyTorch FSDP2", "ds1": "DeepSpeed ZeRO-1",
         "ds3": "DeepSpeed ZeRO-3"}
# zeroshard stage -> the peers it is set against.
PAIRS = [(0, "ddp"), (1, "ds1"), (3, "ds3"), (3, "fsdp2")]


def load(path):
    with open(path) as f:
        return json.load(f)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def first_line(path):
    with open(path) as f:
        lines = [l.strip() for l in f if l.strip()]
    errs = [l for l in lines if re.search(r"Error|error:|not supported|NotImplemented", l)]
    return (errs or lines or ["(no stderr)"])[-1][:200]


def zs_run(base):
    """One gpt_train run: {median_ms, split{...}, last_loss, blas} from its
    printed summary."""
    r = {}
    if os.path.exists(base + ".txt"):
        with open(base + ".txt") as f:
            text = f.read()
        # gpt_train's summary (stdout):
        #   tokens/s 1234 (wall 5.67 s); median step 89.0 ms
        #   rank 0 per step (ms): compute 70.1, exposed comm 3.2, optimizer 5.0, ...
        # Its tokens/s is over the wall time, the first steps included; the
        # table uses the median step, as for the peers (tokens_per_s is then
        # computed by the caller).
        if "median_ms" not in r:
            m = re.search(r"median step ([0-9.]+) ms", text)
            if m:
                r["median_ms"] = float(m.group(1))
        m = re.search(r"tokens/s ([0-9.]+) \(wall ([0-9.]+) s\)", text)
        if m:
            r["tokens_per_s_wall"] = float(m.group(1))
        m = re.search(r"per step \(ms\): ([^\n]*)", text)
        if m and "split" not in r:
            r["split"] = {}
            for part in m.group(1).split(","):
                mm = re.match(r"\s*([a-z ]+?) ([0-9.]+)\s*$", part)
                if mm:
                    r["split"][mm.group(1).replace(" ", "_")] = float(mm.group(2))
        m = re.search(r"final loss ([0-9.]+)", text)
        if m:
            r["last_loss"] = float(m.group(1))
    for ext in (".txt", ".err"):  # gpt_train's own BLAS line (stderr in newer trainers)
        if "blas" not in r and os.path.exists(base + ext):
            with open(base + ext) as f:
                m = re.search(r"BLAS: ([^\n]*)", f.read())
            if m:
                r["blas"] = m.group(1).strip()
    return r


def collect(raw, meta):
    runs = {}  # (fw, prec, n) -> [run dicts]; fw "zs0".."zs3" or a peer
    fails = {}
    for path in glob.glob(os.path.join(raw, "*")):
        base = os.path.basename(path)
        m = re.match(r"zs_s(\d)_(fp32|bf16)_r(\d+)_(\d+)\.txt$", base)
        if m:
            key = ("zs%s" % m.group(1), m.group(2), int(m.group(3)))
            r = zs_run(path[:-4])
            if "median_ms" in r:
                r["tokens_per_s"] = (int(m.group(3)) * meta["micro_batch"] * meta["seq"]
                                     / (r["median_ms"] / 1e3))
            if not os.path.exists(path[:-4] + ".fail"):
                runs.setdefault(key, []).append(r)
            continue
        m = re.match(r"(ddp|fsdp2|ds1|ds3)_(fp32|bf16)_r(\d+)_(\d+)\.json$", base)
        if m:
            runs.setdefault((m.group(1), m.group(2), int(m.group(3))), []).append(load(path))
            continue
        m = re.match(r"(?:zs_s(\d)|(split_)?(ddp|fsdp2|ds1|ds3))_(fp32|bf16)_r(\d+)(?:_\d+)?\.fail$",
                     base)
        if m:
            fw = "zs%s" % m.group(1) if m.group(1) else (m.group(2) or "") + m.group(3)
            fails[(fw, m.group(4), int(m.group(5)))] = first_line(path)
    splits = {}
    for path in glob.glob(os.path.join(raw, "split_*.json")):
        m = re.match(r"split_(\w+?)_(fp32|bf16)_r(\d+)\.json$", os.path.basename(path))
        splits[(m.group(1), m.group(2), int(m.group(3)))] = load(path)
    return runs, fails, splits


def flops_per_token(cfg, seq):
    c, layers, vocab, pos = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
    # GPT-2 params: wte V C, wpe P C, per block 12 C^2 + 13 C, ln_f 2 C.
    params = vocab * c + pos * c + layers * (12 * c * c + 13 * c) + 2 * c
    return 6 * (params - pos * c) + 12 * layers * c * seq, params


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw, out = argv[1], argv[2]
    meta = load(os.path.join(raw, "meta.json"))
    peak = load(os.path.join(raw, "gemm_peak.json"))
    end_path = os.path.join(raw, "gemm_peak_end.json")
    if os.path.exists(end_path):  # measured again after the runs: the better of the two
        end = load(end_path)
        for dt in ("fp32", "bf16"):
            peak[dt + "_start_end"] = [peak[dt]["best_gflops"], end[dt]["best_gflops"]]
            if end[dt]["best_gflops"] > peak[dt]["best_gflops"]:
                peak[dt] = end[dt]
    cfg = load(os.path.join(raw, "config.json"))
    cpu = peak.get("cpu", "?")
    lscpu = os.path.join(raw, "lscpu.txt")
    if os.path.exists(lscpu):  # lscpu's model name, with family / model (a VM may hide the rest)
        with open(lscpu) as f:
            fields = dict(l.split(":", 1) for l in f if ":" in l)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        cpu = "%s (family %s, model %s%s)" % (
            fields.get("Model name", cpu), fields.get("CPU family", "?"), fields.get("Model", "?"),
            ", AVX-512 BF16" if "avx512_bf16" in fields.get("Flags", "") else "")
    runs, fails, splits = collect(raw, meta)
    fpt, params = flops_per_token(cfg, meta["seq"])
    cores = meta["nproc"]
    ranks = [int(n) for n in meta["ranks"].split()]
    precs = meta["precisions"].split()

    summary = {}
    for key, rs in runs.items():
        tps = [r.get("tokens_per_s") for r in rs]
        summary[key] = {
            "tokens_per_s": median(tps),
            "tokens_per_s_runs": tps,
            "median_ms": median([r.get("median_ms") for r in rs]),
            "cpu_per_wall": median([max((p.get("cpu_per_wall", 0) for p in r.get("per_rank", [])),
                                        default=0) or None for r in rs]),
            # Rank 0's loss at the last step: the peers start from the same
            # weights (torch seed) and read the same batches, so at fp32
            # they agree closely (a check that they train the same model).
            "last_loss": median([r["per_rank"][0]["last_loss"] if r.get("per_rank")
                                 else r.get("last_loss") for r in rs]),
        }
        t = summary[key]["tokens_per_s"]
        n = key[2]
        if t:
            achieved = t * fpt
            summary[key]["mfu_sgemm"] = achieved / (min(n, cores) * peak["fp32"]["best_gflops"] * 1e9)
            summary[key]["mfu_bf16_gemm"] = achieved / (
                min(n, cores) * peak["bf16"]["best_gflops"] * 1e9)

    print("\nGPT side by side: n_layer %d, n_head %d, n_embd %d, vocab %d, seq %d, micro-batch %d"
          " per process, %d steps (median after %d), %d interleaved repeat(s)"
          % (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"], meta["seq"],
             meta["micro_batch"], meta["steps"], meta["warmup"], meta["repeats"]))
    print("CPU: %s, %d cores; one compute thread per process%s" % (
        cpu, cores, "; %d processes on %d cores oversubscribe every framework alike"
        % (max(ranks), cores) if cores < max(ranks) else ""))
    src = {"torch": "torch.mm", "numpy": "numpy's sgemm, %s" % peak.get("numpy_fp32", {}).get(
        "blas", "?")}.get(peak["fp32"].get("source", "torch"))
    print("single-thread GEMM peak at %d^3, the best before and after the runs: fp32 %.1f GFLOP/s"
          " (%s; torch.mm %.1f), bf16 %.1f GFLOP/s (torch.mm);\n  torch %s: %s"
          % (peak["size"], peak["fp32"]["best_gflops"], src,
             peak.get("torch_fp32", peak["fp32"])["best_gflops"], peak["bf16"]["best_gflops"],
             peak["torch"], peak.get("torch_blas", "?")))
    print("FLOPs per token = 6 N + 12 L C T = 6 * %d + 12 * %d * %d * %d = %.3f MFLOP (N = %d params"
          " less wpe)" % (params - cfg["n_positions"] * cfg["n_embd"], cfg["n_layer"],
                          cfg["n_embd"], meta["seq"], fpt / 1e6,
                          params - cfg["n_positions"] * cfg["n_embd"]))

    fws = ["zs%s" % s for s in meta["zs_stages"].split()] + [p for p in PEERS]
    names = dict(LABEL)
    names.update({"zs%s" % s: "zeroshard stage %s" % s for s in "0123"})
    print("\nTokens/s (median over repeats; each run: global tokens per step / median step)")
    print("  %-5s %-5s %-20s %10s %9s %7s %7s %9s %9s %s" % (
        "procs", "prec", "framework", "tokens/s", "step ms", "MFU", "MFU32", "cpu/wall",
        "last loss", "tokens/s of each run"))
    for n in ranks:
        for prec in precs:
            for fw in fws:
                s = summary.get((fw, prec, n))
                if s is None:
                    why = fails.get((fw, prec, n))
                    if why:
                        print("  %-5d %-5s %-20s failed: %s" % (n, prec, names[fw], why))
                    continue
                own = s.get("mfu_bf16_gemm" if prec == "bf16" else "mfu_sgemm")
                print("  %-5d %-5s %-20s %10s %9s %6s%% %6s%% %9s %9s %s" % (
                    n, prec, names[fw], fmt(s["tokens_per_s"], "%.0f"), fmt(s["median_ms"]),
                    fmt(100 * own if own else None, "%.1f"),
                    fmt(100 * s["mfu_sgemm"] if s.get("mfu_sgemm") else None, "%.1f"),
                    fmt(s["cpu_per_wall"], "%.2f"), fmt(s["last_loss"], "%.5f"),
                    " ".join(fmt(v, "%.0f") for v in s["tokens_per_s_runs"])))
    print("  MFU: achieved FLOP/s over min(procs, cores) x the single-thread GEMM peak of the run's"
          " precision\n  (fp32: sgemm; bf16: torch.mm bf16); MFU32: over the fp32 sgemm peak for"
          " every row; cpu/wall: a peer's\n  process CPU time over wall time in its loop, slowest"
          " rank (1.0 = a core to itself)")
    if "bf16" in precs:
        print("  bf16: zeroshard keeps bf16 params and gradients (and communicates them) with an fp32"
              " master and\n  computes in fp32 (docs/gpt.md); the peers run torch.autocast(\"cpu\","
              " bfloat16): bf16 products, fp32 params")

    ratios = []
    print("\nRatios, tokens/s zeroshard / peer (the goal: >= 1.0)")
    print("  %-5s %-5s %-42s %8s" % ("procs", "prec", "pair", "ratio"))
    for n in ranks:
        for prec in precs:
            for stage, peer in PAIRS:
                z, p = summary.get(("zs%d" % stage, prec, n)), summary.get((peer, prec, n))
                if not z or not p or not z["tokens_per_s"] or not p["tokens_per_s"]:
                    continue
                r = z["tokens_per_s"] / p["tokens_per_s"]
                ratios.append({"ranks": n, "precision": prec, "zeroshard_stage": stage,
                               "peer": peer, "ratio": r})
                print("  %-5d %-5s %-42s %7.3fx" % (
                    n, prec, "zeroshard stage %d / %s" % (stage, LABEL[peer]), r))

    print("\nStep-time split, ms per step (peers: the median step of an instrumented run with a"
          " barrier after each phase;\nzeroshard: gpt_train's own split, rank 0's mean over all"
          " steps of each run, median over repeats)")
    print("  %-5s %-5s %-20s %8s %8s %8s %9s %9s %8s %8s  %s" % (
        "procs", "prec", "framework", "forward", "backward", "fwd+bwd", "optimizer", "exp.comm",
        "other", "total", "note"))
    split_rows = []
    notes = {"ddp": "exp.comm = backward - backward under no_sync",
             "fsdp2": "comm inside: all-gathers in fwd+bwd, reduce-scatters in bwd",
             "ds1": "comm inside: reduction in bwd, all-gather in optimizer",
             "ds3": "comm inside: all-gathers in fwd+bwd, reduce-scatter in bwd"}
    for n in ranks:
        for prec in precs:
            for fw in fws:
                if fw.startswith("zs"):
                    sp = [r["split"] for r in runs.get((fw, prec, n), []) if r.get("split")]
                    if not sp:
                        continue
                    row = {k: median([x.get(k) for x in sp]) for k in sorted(set().union(*sp))}
                    note = "other = engine other + input wait"
                    cols = (row.get("forward"), row.get("backward"), row.get("compute"),
                            row.get("optimizer"), row.get("exposed_comm"),
                            (row.get("engine_other") or 0) + (row.get("input_wait") or 0),
                            row.get("total"))
                else:
                    j = splits.get((fw, prec, n))
                    if j is None:
                        why = fails.get(("split_" + fw, prec, n))
                        if why:
                            print("  %-5d %-5s %-20s failed: %s" % (n, prec, names[fw], why))
                        continue
                    row = j["split"]
                    note = notes[fw]
                    exposed = row.get("exposed_comm")
                    if n == 1:
                        note = "one process: no communication"
                        if exposed is not None:  # with and without no_sync: the method's noise
                            note += " (backward with - without no_sync: %.1f ms, noise)" % exposed
                        exposed = None
                    total = row["forward"] + row["backward"] + row["optimizer"]
                    cols = (row["forward"], row["backward"], row["forward"] + row["backward"],
                            row["optimizer"], exposed, None, total)
                split_rows.append({"ranks": n, "precision": prec, "framework": fw, "split": row})
                print("  %-5d %-5s %-20s %8s %8s %8s %9s %9s %8s %8s  %s" % (
                    (n, prec, names[fw]) + tuple(fmt(c) for c in cols) + (note,)))

    extras = sorted({r.get("blas")
                     for k, rs in runs.items() if k[0].startswith("zs") for r in rs} - {None},
                    key=str)
    if not extras and meta.get("zeroshard_blas") and meta["zeroshard_blas"] != "-":
        # A gpt_train that does not print its BLAS: what the library it links picks.
        extras = ["%s (from the library gpt_train links)" % meta["zeroshard_blas"]]
    if extras:
        print("\nzeroshard: gpt_train launched by %s; its BLAS: %s" % (
            "mpirun, one process per rank (--backend mpi)" if meta.get("zs_launch") == "mpi"
            else "itself, in-process ranks (--backend local)", "; ".join(str(e) for e in extras)))
    peer_info = next((r for k, rs in runs.items() if not k[0].startswith("zs") for r in rs), None)
    if peer_info:
        print("peers: torch %s, transformers %s, attention %s, AdamW fused %s" % (
            peer_info["torch"], peer_info["transformers"], peer_info["attn_implementation"],
            peer_info["fused_adamw"]))
    ds = next((r for k, rs in runs.items() if k[0].startswith("ds") for r in rs), None)
    if ds:
        print("DeepSpeed %s, optimizer %s" % (ds["deepspeed"], ds["ds_optimizer"]))
    if meta.get("deepspeed_error"):
        print("DeepSpeed left out: %s" % meta["deepspeed_error"])

    result = {
        "meta": meta, "gemm_peak": peak, "config": cfg, "flops_per_token": fpt, "params": params,
        "summary": [dict(framework=k[0], precision=k[1], ranks=k[2], **v)
                    for k, v in sorted(summary.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0]))],
        "ratios": ratios, "splits": split_rows,
        "failures": [dict(framework=k[0], precision=k[1], ranks=k[2], error=v)
                     for k, v in sorted(fails.items())],
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("\nwrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
