"""Reads the raw outputs of perf/peers/run.sh and prints zeroshard and PyTorch
side by side; writes the JSON summary.

  python3 perf/peers/compare.py RAW_DIR OUT_JSON

RAW_DIR holds, for repeat k (1-based):
  z_r{R}_s{S}_{k}.txt    mlp_demo's stdout (R ranks, ZeRO stage S)
  t_r{R}_{ddp|zero}_{k}.json   torch_mlp.py's result
  z_adam_{k}.txt         adam_bench's stdout
  t_adam_{k}.json        torch_adam.py's result
Stage 0 is set against DDP, stage 1 against DDP + ZeroRedundancyOptimizer.
Every figure is the median over the repeats. Standard library only (runs
with the system python3).
"""

import glob
import json
import os
import re
import statistics
import sys

# TODO(i12-perf): read mlp_demo --json once it lands instead of parsing the
# "time per step" table of examples/mlp/demo_report.cc.
TIME_COLUMNS = ["compute", "exposed_comm", "optimizer", "input_wait", "engine_other", "bubble",
                "total", "hidden_comm"]
OPTIM_OF_STAGE = {0: "ddp", 1: "zero"}
LABEL_OF_OPTIM = {"ddp": "DDP", "zero": "DDP+ZeroRedundancyOptimizer"}


def parse_demo_times(path):
    """Per-rank rows of mlp_demo's time table: [{column: ms}], rank order."""
    rows, in_table = [], False
    with open(path) as f:
        for line in f:
            if line.startswith("time per step"):
                in_table = True
                continue
            if not in_table:
                continue
            m = re.match(r"\s+rank (\d+)\s+(.*)$", line)
            if m:
                values = [float(v) for v in m.group(2).split()]
                if len(values) != len(TIME_COLUMNS):
                    raise ValueError("%s: time row with %d columns, expected %d (did the "
                                     "table change?)" % (path, len(values), len(TIME_COLUMNS)))
                rows.append(dict(zip(TIME_COLUMNS, values)))
    if not rows:
        raise ValueError("%s: no 'time per step' rank rows (did mlp_demo fail?)" % path)
    return rows


def zeroshard_step(path):
    """The ranks' split and the quoted figures of one mlp_demo run.

    total_ms is the slowest rank's step; less_input_ms is the LARGEST of
    (total - input wait) over ranks: the rank that waited least for its
    inputs, so the figure is never flattered by a slow producer elsewhere.
    """
    rows = parse_demo_times(path)
    blas = None
    median_less_input = None  # an mlp_demo from before it printed medians
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*BLAS \(.*?\): (.*)$", line)
            if m:
                blas = m.group(1).strip()
            m = re.match(r"\s*distributed run, median step after \d+ warm-up steps, slowest "
                         r"rank: total ([0-9.]+) ms, less input wait ([0-9.]+) ms", line)
            if m:
                median_less_input = float(m.group(2))
    return {
        "total_ms": max(r["total"] for r in rows),
        "less_input_ms": max(r["total"] - r["input_wait"] for r in rows),
        "per_rank": rows,
        "blas": blas,  # None: an mlp_demo from before it printed its BLAS
        # The median step less input wait after the warm-up steps, slowest
        # rank: timed as PyTorch's side is.
        "median_less_input_ms": median_less_input,
    }


def parse_adam_bench(path):
    """adam_bench's 'adamw fp32' rows, {threads: {...}}: best and mean GB/s
    and the copy's from its summary table; the paired table from the JSON
    beside the text (adam_bench --json, with the RMW baseline) when there is
    one, else from the text (older adam_bench: copy only)."""
    out, section = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("AdamW update vs memcpy"):
                section = "summary"
            elif line.startswith("Paired"):
                section = "paired"
            m = re.match(r"adamw fp32\s+(\d+) threads?\s+(.*)$", line)
            if not m or section is None:
                continue
            threads, fields = int(m.group(1)), m.group(2).split()
            row = out.setdefault(threads, {})
            if section == "summary":
                (row["best_gbps"], row["copy_best_gbps"], row["best_ratio"], row["mean_gbps"],
                 row["copy_mean_gbps"], row["mean_ratio"]) = [float(v) for v in fields]
            elif len(fields) == 3:  # older adam_bench: median min max of update/copy
                row["paired_ratio_median"], row["paired_ratio_min"], row["paired_ratio_max"] = [
                    float(v) for v in fields]
    json_path = os.path.splitext(path)[0] + ".json"
    if os.path.exists(json_path):
        with open(json_path) as f:
            for r in json.load(f)["results"]:
                if r["kernel"] != "adamw fp32" or r["threads"] not in out:
                    continue
                row = out[r["threads"]]
                row["paired_ratio_median"] = r["vs_copy"]["median"]
                row["paired_vs_rmw_median"] = r["vs_rmw"]["median"]
                row["paired_best_gbps"] = r["gbps"]["max"]
                row["paired_copy_best_gbps"] = r["copy_gbps"]["max"]
                row["paired_rmw_best_gbps"] = r["rmw_gbps"]["max"]
                if "streams_gbps" in r:  # older adam_bench: no streams baseline
                    row["paired_streams_best_gbps"] = r["streams_gbps"]["max"]
                    row["paired_vs_streams_median"] = r["vs_streams"]["median"]
    if not out:
        raise ValueError("%s: no 'adamw fp32' rows (did adam_bench fail?)" % path)
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec="%.2f"):
    return "-" if v is None else spec % v


def compare_steps(raw):
    rows = []
    for path in sorted(glob.glob(os.path.join(raw, "z_r*_s*_1.txt"))):
        m = re.search(r"z_r(\d+)_s(\d+)_1\.txt$", path)
        ranks, stage = int(m.group(1)), int(m.group(2))
        optim = OPTIM_OF_STAGE[stage]
        z = [zeroshard_step(p) for p in sorted(glob.glob(
            os.path.join(raw, "z_r%d_s%d_*.txt" % (ranks, stage))))]
        t = []
        for p in sorted(glob.glob(os.path.join(raw, "t_r%d_%s_*.json" % (ranks, optim)))):
            with open(p) as f:
                t.append(json.load(f))
        row = {
            "ranks": ranks,
            "zeroshard_stage": stage,
            "pytorch": optim,
            "repeats": [len(z), len(t)],
            "zeroshard_total_ms": median([r["total_ms"] for r in z]),
            "zeroshard_less_input_ms": median([r["less_input_ms"] for r in z]),
            "pytorch_median_ms": median([r["median_ms"] for r in t]),
            "pytorch_mean_all_ms": median([r["mean_all_ms"] for r in t]),
            "zeroshard_runs": z,
            "pytorch_runs": t,
        }
        # Older torch_mlp.py results lack it; None prints as "-".
        row["pytorch_cpu_per_wall"] = median(
            [max(p.get("cpu_per_wall", 0) for p in r["per_rank"]) or None for r in t])
        zl, tm = row["zeroshard_less_input_ms"], row["pytorch_median_ms"]
        row["ratio"] = zl / tm if zl and tm else None
        row["zeroshard_median_less_input_ms"] = median([r["median_less_input_ms"] for r in z])
        zm = row["zeroshard_median_less_input_ms"]
        row["ratio_median"] = zm / tm if zm and tm else None
        row["blas"] = next((r["blas"] for r in z if r.get("blas")), None)
        if t:
            row["torch"] = t[0]["torch"]
            row["fused_adamw"] = t[0]["fused_adamw"]
        rows.append(row)
    rows.sort(key=lambda r: (r["ranks"], r["zeroshard_stage"]))
    return rows


def compare_adam(raw):
    z = [parse_adam_bench(p) for p in sorted(glob.glob(os.path.join(raw, "z_adam_*.txt")))]
    t = []
    for p in sorted(glob.glob(os.path.join(raw, "t_adam_*.json"))):
        with open(p) as f:
            t.append(json.load(f))
    if not z and not t:
        return []
    rows = []
    for threads in (1, 2):
        zs = [run[threads] for run in z if threads in run]
        ts = [r for run in t for r in run["rows"] if r["threads"] == threads]
        if not zs or not ts:
            continue
        row = {"threads": threads, "n": t[0]["n"], "pytorch_impl": t[0]["impl"],
               "repeats": [len(zs), len(ts)]}
        row["zeroshard_best_gbps"] = median([r["best_gbps"] for r in zs])
        row["zeroshard_mean_gbps"] = median([r["mean_gbps"] for r in zs])
        row["zeroshard_paired_vs_memcpy"] = median([r.get("paired_ratio_median") for r in zs])
        row["zeroshard_paired_vs_rmw"] = median([r.get("paired_vs_rmw_median") for r in zs])
        row["zeroshard_paired_vs_streams"] = median(
            [r.get("paired_vs_streams_median") for r in zs])
        row["pytorch_best_gbps"] = median([r["update_best_gbps"] for r in ts])
        row["pytorch_median_gbps"] = median([r["update_median_gbps"] for r in ts])
        row["pytorch_paired_vs_copy"] = median([r["paired_ratio_median"] for r in ts])
        # The roofline (the issue's "in-place read-modify-write roofline of
        # the same traffic"): the fastest pass over the same bytes measured
        # in this run: adam_bench's streams baseline (the update's own 4 read
        # and 3 written-back streams, trivial arithmetic), its one-buffer RMW,
        # memcpy, torch copy_ and numpy copyto, each the median over repeats
        # of its best iteration. torch's p += g is printed beside them but is
        # not the same traffic: 2 reads per write (8 of its 12 B read) where
        # the update reads 16 of its 28 B, and reads stream faster than
        # write-backs, so its GB/s is not a limit for the update.
        streams = {
            "adam_bench streams": median([r.get("paired_streams_best_gbps") for r in zs]),
            "adam_bench RMW": median([r.get("paired_rmw_best_gbps") for r in zs]),
            "adam_bench memcpy": median(
                [max(r["copy_best_gbps"], r.get("paired_copy_best_gbps", 0)) for r in zs]),
            "torch copy_": median([r["copy_torch_best_gbps"] for r in ts]),
            "numpy copyto": median([r["copy_numpy_best_gbps"] for r in ts]),
        }
        row["streams_gbps"] = streams
        row["other_streams_gbps"] = {
            "torch p += g": median([r["rmw_torch_best_gbps"] for r in ts])}
        row["roofline_source"] = max(streams, key=lambda k: streams[k] or 0)
        row["roofline_gbps"] = streams[row["roofline_source"]]
        row["zeroshard_vs_other_streams"] = {
            k: (row["zeroshard_best_gbps"] / v if v else None)
            for k, v in row["other_streams_gbps"].items()}
        row["zeroshard_vs_pytorch"] = row["zeroshard_best_gbps"] / row["pytorch_best_gbps"]
        row["zeroshard_vs_roofline"] = row["zeroshard_best_gbps"] / row["roofline_gbps"]
        row["pytorch_vs_roofline"] = row["pytorch_best_gbps"] / row["roofline_gbps"]
        rows.append(row)
    return rows


def print_tables(steps, adam, meta):
    if steps:
        print("\nStep time, ms (median over %s interleaved repeats; zeroshard: Engine::Stats() mean "
              "over all steps,\nslowest rank; PyTorch: median per step after %s warm-up steps, "
              "slowest rank; data made\noutside PyTorch's timed step, so it is set against "
              "zeroshard's step less input wait)"
              % (meta.get("repeats", "?"), meta.get("warmup", "?")))
        print("  %-5s %-38s %9s %10s %9s %9s %9s %8s %8s %9s" % (
            "ranks", "zeroshard vs PyTorch", "zs total", "zs -input", "zs med", "pt step",
            "pt mean", "pt cpu/w", "ratio", "ratio med"))
        for r in steps:
            label = "stage %d vs %s" % (r["zeroshard_stage"], LABEL_OF_OPTIM[r["pytorch"]])
            print("  %-5d %-38s %9s %10s %9s %9s %9s %8s %8s %9s" % (
                r["ranks"], label, fmt(r["zeroshard_total_ms"]), fmt(r["zeroshard_less_input_ms"]),
                fmt(r.get("zeroshard_median_less_input_ms")), fmt(r["pytorch_median_ms"]),
                fmt(r["pytorch_mean_all_ms"]), fmt(r["pytorch_cpu_per_wall"]),
                fmt(r["ratio"], "%.3fx"), fmt(r.get("ratio_median"), "%.3fx")))
        blas = sorted({r["blas"] for r in steps if r.get("blas")})
        if blas:
            print("  zeroshard's BLAS: %s" % "; ".join(blas))
        print("  zs med: zeroshard's median step less input wait after the warm-up steps, "
              "slowest rank (timed as PyTorch's pt step);\n  ratio med = zs med / pt step, "
              "like for like; ratio uses zeroshard's mean over all steps, warm-up included")
        print("  ratio = zs -input / pt step (the issue's bar: <= 0.8x against DDP); pt mean: "
              "PyTorch's mean over all steps,\n  warm-up included, like zeroshard's; pt cpu/w: "
              "PyTorch's process CPU time / wall time in the loop\n  (about 1: one busy thread "
              "per rank, as zeroshard's one OpenBLAS thread)")
    if adam:
        print("\nAdamW fp32, %d elements, 28 B/element (median over %s interleaved repeats of each "
              "side's best iteration; PyTorch: %s)" % (adam[0]["n"], meta.get("repeats", "?"),
                                                      adam[0]["pytorch_impl"]))
        print("  %-8s %9s %9s %9s %9s %-18s %8s %8s" % ("threads", "zs GB/s", "pt GB/s", "zs/pt",
                                                       "roofline", "(from)", "zs/roof",
                                                       "pt/roof"))
        for r in adam:
            print("  %-8d %9.2f %9.2f %8.3fx %9.2f %-18s %7.3fx %7.3fx" % (
                r["threads"], r["zeroshard_best_gbps"], r["pytorch_best_gbps"],
                r["zeroshard_vs_pytorch"], r["roofline_gbps"], "(" + r["roofline_source"] + ")",
                r["zeroshard_vs_roofline"], r["pytorch_vs_roofline"]))
        for r in adam:
            s = ", ".join("%s %.2f" % (k, v) for k, v in r["streams_gbps"].items() if v)
            other = ", ".join("%s %.2f (zs / it %s)" % (
                k, v, fmt(r["zeroshard_vs_other_streams"][k], "%.3f"))
                for k, v in r["other_streams_gbps"].items() if v)
            print("  %d thread%s streams (GB/s of the same bytes): %s;\n    not the same traffic: "
                  "%s;\n    paired (alternating runs): zs/streams %s, zs/memcpy %s, zs/RMW %s, "
                  "pt/copy_ %s" % (
                      r["threads"], "" if r["threads"] == 1 else "s", s, other or "-",
                      fmt(r["zeroshard_paired_vs_streams"], "%.3f"),
                      fmt(r["zeroshard_paired_vs_memcpy"], "%.3f"),
                      fmt(r["zeroshard_paired_vs_rmw"], "%.3f"),
                      fmt(r["pytorch_paired_vs_copy"], "%.3f")))
        print("  the issue's bar: zs/pt >= 1.0x and zs/roof >= 0.95x")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw, out = argv[1], argv[2]
    meta = {}
    meta_path = os.path.join(raw, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    steps = compare_steps(raw)
    adam = compare_adam(raw)
    print_tables(steps, adam, meta)
    with open(out, "w") as f:
        json.dump({"meta": meta, "steps": steps, "adamw": adam}, f, indent=1)
    print("\nwrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
