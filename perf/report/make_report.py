#!/usr/bin/env python3
"""Writes the `make perf` report: report.md, report.html and SVG charts.

usage: make_report.py [--dir build/perf] [--check] [--expect LAYERS]
       make_report.py [--dir build/perf] --cpus-per-rank BACKEND RANKS

Reads what the perf layers wrote into DIR (each optional; a missing layer is
named in the report):
  kernels.json             perf/kernels/adam_bench --json
  offload.json             perf/runtime/offload_bench --json (the optimizer state's
                           host and NVMe tiers against their own limits)
  collectives_*.json       perf/comm/collective_bench --json (one per backend / world)
  step_*.json              perf/runtime/step_bench --json (local; mpi, one per world)
  machine.json             zeroshard calibrate (the machine profile)
  predicted_*.json         zeroshard estimate --machine machine.json --json (one per
                           backend and rank count): the calibrated model's step time
and writes into DIR: report.md, report.html (the same, for a browser and the
screenshot check), step_split.svg, scaling.svg, collectives_<backend>.svg,
kernels.svg, offload.svg. --check: exit 1 unless every SVG parses as XML and
every layer of --expect (comma separated: step,collectives,kernels,model,
offload; default: at least one) was found and reported (the ctest smoke run
uses it).

--cpus-per-rank BACKEND RANKS prints, instead of writing the report, what
run_perf.sh passes to `zeroshard estimate --cpus-per-rank` for that backend
and rank count: the fewest CPUs a rank of its step run could use (step_bench's
`cpus`), or 0 when every rank could use all machine.json's cores (not bound)
or the step run did not record it.

Python 3 standard library only.
"""

import argparse
import glob
import html
import json
import math
import os
import sys
import xml.etree.ElementTree as ElementTree

# Colours (colour-blind safe: Okabe-Ito), one per step part, in stack order.
PART_COLOURS = {
    "compute": "#0072B2",
    "exposed_comm": "#D55E00",
    "optimizer": "#009E73",
    "input_wait": "#F0E442",
    "engine_other": "#999999",
    "pipeline_bubble": "#CC79A7",
}
HIDDEN_COLOUR = "#E69F00"
SERIES_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#E69F00", "#000000"]
PART_LABELS = {
    "compute": "compute",
    "exposed_comm": "exposed comm",
    "optimizer": "optimizer",
    "input_wait": "input wait",
    "engine_other": "engine other",
    "pipeline_bubble": "pipeline bubble",
    "hidden_comm": "hidden comm (not in total)",
}
FONT = "font-family:DejaVu Sans,Arial,sans-serif"


class Svg:
    """A minimal SVG writer: elements appended as strings."""

    def __init__(self, width, height, title):
        self.width, self.height = width, height
        self.items = [
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
            self.text_item(width / 2, 24, title, size=16, anchor="middle", weight="bold"),
        ]

    @staticmethod
    def text_item(x, y, text, size=12, anchor="start", weight="normal", rotate=None, fill="#222"):
        transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
        return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                f'font-weight="{weight}" fill="{fill}" style="{FONT}"{transform}>'
                f"{html.escape(str(text))}</text>")

    def text(self, *args, **kwargs):
        self.items.append(self.text_item(*args, **kwargs))

    def rect(self, x, y, w, h, fill, stroke="none", extra=""):
        self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" '
                          f'height="{max(h, 0):.1f}" fill="{fill}" stroke="{stroke}" {extra}/>')

    def line(self, x1, y1, x2, y2, stroke="#444", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{stroke}" stroke-width="{width}"{d}/>')

    def polyline(self, points, stroke, width=2, dash=None, markers=True):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.items.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" '
                          f'stroke-width="{width}"{d}/>')
        if markers:
            for x, y in points:
                self.items.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{stroke}"/>')

    def legend(self, x, y, entries, columns=1, col_width=200):
        """entries: (label, colour, kind) with kind 'box', 'line', 'dash', 'dot' or 'hatch'."""
        for i, (label, colour, kind) in enumerate(entries):
            cx = x + (i % columns) * col_width
            cy = y + (i // columns) * 18
            if kind == "box":
                self.rect(cx, cy - 10, 12, 12, colour)
            elif kind == "hatch":
                self.rect(cx, cy - 10, 12, 12, "url(#hatch)", stroke=colour)
            else:
                dash = {"dash": "5,3", "dot": "2,3"}.get(kind)
                self.line(cx, cy - 4, cx + 16, cy - 4, colour, 2, dash)
            self.text(cx + 20, cy, label, size=12)

    def save(self, path):
        defs = ('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
                f'patternTransform="rotate(45)"><rect width="6" height="6" fill="white"/>'
                f'<line x1="0" y1="0" x2="0" y2="6" stroke="{HIDDEN_COLOUR}" stroke-width="3"/>'
                "</pattern></defs>")
        body = "\n".join(self.items)
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                    f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">\n'
                    f"{defs}\n{body}\n</svg>\n")


def nice_ticks(top, count=5):
    """Round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0, 1]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def fmt_tick(v):
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.0e}"


class LogAxes:
    """A log10 y axis over whole decades, with grid lines and labels."""

    def __init__(self, svg, left, top, width, height, y_min, y_max, y_label, x_label):
        self.svg, self.left, self.top, self.width, self.height = svg, left, top, width, height
        self.lo = math.floor(math.log10(y_min))
        self.hi = max(self.lo + 1, math.ceil(math.log10(y_max)))
        for e in range(self.lo, self.hi + 1):
            y = self.y(10.0 ** e)
            svg.line(left, y, left + width, y, "#ddd")
            svg.text(left - 6, y + 4, f"{10.0 ** e:g}", size=11, anchor="end")
        svg.line(left, top, left, top + height)
        svg.line(left, top + height, left + width, top + height)
        if y_label:
            svg.text(left - 50, top + height / 2, y_label, size=12, anchor="middle", rotate=-90)
        svg.text(left + width / 2, top + height + 40, x_label, size=12, anchor="middle")

    def y(self, v):
        v = min(max(v, 10.0 ** self.lo), 10.0 ** self.hi)
        return self.top + self.height * (1 - (math.log10(v) - self.lo) / (self.hi - self.lo))


class Axes:
    """A linear y axis (from 0) on a plot area, with grid lines and labels."""

    def __init__(self, svg, left, top, width, height, y_max, y_label, x_label):
        self.svg, self.left, self.top, self.width, self.height = svg, left, top, width, height
        self.ticks = nice_ticks(y_max)
        self.y_top = self.ticks[-1]
        for t in self.ticks:
            y = self.y(t)
            svg.line(left, y, left + width, y, "#ddd")
            svg.text(left - 6, y + 4, fmt_tick(t), size=11, anchor="end")
        svg.line(left, top, left, top + height)
        svg.line(left, top + height, left + width, top + height)
        svg.text(left - 48, top + height / 2, y_label, size=12, anchor="middle", rotate=-90)
        svg.text(left + width / 2, top + height + 40, x_label, size=12, anchor="middle")

    def y(self, v):
        return self.top + self.height * (1 - v / self.y_top)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        print(f"make_report: cannot read {path}: {error}", file=sys.stderr)
        return None


def human_bytes(b):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            v = b / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{b} B"


# ---------------------------------------------------------------- step layer


def step_runs(step_files):
    """Every run of every step_bench file, tagged with its backend."""
    runs = []
    for data in step_files:
        for run in data["runs"]:
            runs.append(dict(run, backend=data["backend"]))
    # mpi files hold one world each: scaling efficiency against the 1-rank file.
    one = {(r["backend"], r["stage"]): r["samples_per_s"] for r in runs if r["ranks"] == 1}
    for r in runs:
        if r.get("scaling_efficiency") is None and (r["backend"], r["stage"]) in one:
            r["scaling_efficiency"] = r["samples_per_s"] / (r["ranks"] * one[(r["backend"], r["stage"])])
    return sorted(runs, key=lambda r: (r["backend"], r["ranks"], r["stage"]))


def measured_cpus_per_rank(step_files, backend, ranks, cores):
    """The binding step_bench measured for (backend, ranks): the fewest CPUs a
    rank could run on over its runs, as `estimate --cpus-per-rank` takes it
    (0: not bound, every rank could use all `cores`, or not recorded)."""
    cpus = [run["cpus"] for data in step_files if data.get("backend") == backend
            for run in data["runs"] if run["ranks"] == ranks and run.get("cpus")]
    if not cpus or not cores or min(cpus) >= cores:
        return 0
    return min(cpus)


def chart_step_split(runs, parts, path):
    groups = []  # (backend, ranks) -> runs
    for r in runs:
        key = (r["backend"], r["ranks"])
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append(r)
    bars = sum(len(g[1]) for g in groups)
    width = max(640, 120 + bars * 46 + len(groups) * 24)
    svg = Svg(width, 480, "Engine step: where the time goes (ms per step, mean over ranks)")
    y_max = max(max(r["total_ms"], r["hidden_comm_ms"]) for r in runs) * 1.05
    ax = Axes(svg, 80, 50, width - 110, 300, y_max, "ms per step", "")
    x = ax.left + 16
    for (backend, ranks), group in groups:
        start = x
        for r in group:
            y = ax.y(0)
            for p in parts:
                ms = r["parts_ms"].get(p, 0.0)
                h = ax.y(0) - ax.y(ms)
                svg.rect(x, y - h, 26, h, PART_COLOURS.get(p, "#333"))
                y -= h
            hidden = r["hidden_comm_ms"]
            svg.rect(x + 28, ax.y(hidden), 8, ax.y(0) - ax.y(hidden), "url(#hatch)",
                     stroke=HIDDEN_COLOUR)
            svg.text(x + 18, ax.y(0) + 14, f"s{r['stage']}", size=11, anchor="middle")
            x += 46
        svg.text((start + x - 10) / 2, ax.y(0) + 30,
                 f"{ranks} rank{'s' if ranks > 1 else ''} ({backend})", size=12, anchor="middle")
        svg.line(x + 2, ax.top, x + 2, ax.y(0) + 32, "#bbb", 1, "3,3")
        x += 24
    svg.text(ax.left + ax.width / 2, ax.y(0) + 48, "ZeRO stage (s0-s3), grouped by rank count",
             size=12, anchor="middle")
    entries = [(PART_LABELS.get(p, p), PART_COLOURS.get(p, "#333"), "box") for p in parts]
    entries.append((PART_LABELS["hidden_comm"], HIDDEN_COLOUR, "hatch"))
    svg.legend(ax.left, 430, entries, columns=3, col_width=min(260, (width - 120) / 3))
    svg.save(path)


def chart_scaling(runs, path):
    svg = Svg(640, 440, "Scaling efficiency: samples/s on N / (N x samples/s on 1)")
    series = {}
    for r in runs:
        if r.get("scaling_efficiency") is not None:
            series.setdefault((r["backend"], r["stage"]), []).append(
                (r["ranks"], r["scaling_efficiency"]))
    ranks = sorted({n for pts in series.values() for n, _ in pts}) or [1]
    y_max = max([1.0] + [e for pts in series.values() for _, e in pts]) * 1.05
    ax = Axes(svg, 80, 50, 520, 280, y_max, "scaling efficiency", "ranks (weak scaling: fixed batch per rank)")

    def x_of(n):
        if len(ranks) == 1:
            return ax.left + ax.width / 2
        return ax.left + 20 + (ax.width - 40) * (n - ranks[0]) / (ranks[-1] - ranks[0])

    for n in ranks:
        svg.text(x_of(n), ax.y(0) + 16, n, size=11, anchor="middle")
    svg.line(ax.left, ax.y(1.0), ax.left + ax.width, ax.y(1.0), "#777", 2, "2,3")
    entries = [("ideal (1.0)", "#777", "dot")]
    # Colour by stage, line style by backend (local solid, mpi dashed).
    for (backend, stage), pts in sorted(series.items()):
        colour = SERIES_COLOURS[stage % len(SERIES_COLOURS)]
        pts.sort()
        svg.polyline([(x_of(n), ax.y(e)) for n, e in pts], colour,
                     dash="4,2" if backend == "mpi" else None)
        entries.append((f"stage {stage} ({backend})", colour, "dash" if backend == "mpi" else "line"))
    svg.legend(ax.left, 392, entries, columns=3, col_width=175)
    svg.save(path)


def step_section(runs, parts, data0, out_dir, md):
    chart_step_split(runs, parts, os.path.join(out_dir, "step_split.svg"))
    chart_scaling(runs, os.path.join(out_dir, "scaling.svg"))
    model = data0["model"]
    md.append("## Engine step (step_bench)\n")
    md.append(
        f"Model: {model['name']}, {model['blocks']} blocks x hidden {model['hidden']} "
        f"({model['params']:,} params), micro-batch {model['micro_batch']} per rank, "
        f"{data0['precision']}; {data0['warmup']} warm-up + {data0['steps']} timed steps per run. "
        f"Parts are `Engine::Stats()` totals over the timed steps, per step, mean over ranks; they add "
        f"up to *total*. *Hidden comm* (`comm_busy - exposed_comm`) ran behind other work and is not "
        f"part of the total. Cost per epoch: {data0['dataset_samples']:,.0f} samples at "
        f"{data0['price_per_device_hour_usd']:.2f} USD per device-hour (a rank counts as a device).\n")
    md.append("![step split](step_split.svg)\n")
    md.append("![scaling efficiency](scaling.svg)\n")
    head = ["backend", "ranks", "stage", "cpus"] + [PART_LABELS.get(p, p) for p in parts] + [
        "total", "hidden comm", "samples/s", "scaling eff.", "USD/epoch", "plan MiB", "peak MiB",
        "peak/plan"]
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "---|" * len(head))
    for r in runs:
        mem = r["memory"]
        eff = r.get("scaling_efficiency")
        cells = [r["backend"], r["ranks"], r["stage"], r.get("cpus", "-")]
        cells += [f"{r['parts_ms'].get(p, 0.0):.2f}" for p in parts]
        cells += [f"{r['total_ms']:.2f}", f"{r['hidden_comm_ms']:.2f}", f"{r['samples_per_s']:.0f}",
                  "-" if eff is None else f"{eff:.3f}", f"{r['cost_per_epoch_usd']:.4f}",
                  f"{mem['plan_bytes'] / 2**20:.2f}", f"{mem['ledger_peak_bytes'] / 2**20:.2f}",
                  f"{mem['ledger_peak_bytes'] / mem['plan_bytes']:.3f}" if mem["plan_bytes"] else "-"]
        md.append("| " + " | ".join(str(c) for c in cells) + " |")
    md.append("\nTimes in ms per step. *cpus*: the fewest CPUs a rank could run on "
              "(`sched_getaffinity`; mpirun binds a rank to one core at np <= 2). Memory per rank: "
              "the device ledger's peak (max over ranks) against `PlanEngineBuffers`; the trainer's "
              "activations are in neither.\n")



# ------------------------------------------------------- calibrated model


MODEL_LIMIT = 0.20  # the acceptance bound on |predicted - measured| / measured


def model_rows(runs, predicted_files):
    """(run, prediction ms dict, the cpus per rank the model was given) for
    every measured run with a prediction."""
    pred = {}
    for data in predicted_files:
        w = data["workload"]
        for p in data["predictions"]:
            pred[(w["backend"], w["ranks"], p["stage"])] = (p["ms"], w.get("cpus_per_rank", 0))
    return [(r,) + pred[(r["backend"], r["ranks"], r["stage"])] for r in runs
            if (r["backend"], r["ranks"], r["stage"]) in pred]


def model_section(rows, machine, out_dir, md):
    md.append("## Calibrated model: predicted vs measured step time\n")
    if machine:
        colls = ", ".join(f"{b} {','.join(sorted(v, key=int))} ranks"
                          for b, v in sorted(machine["collectives"].items()))
        md.append(
            f"Profile `machine.json` (`zeroshard calibrate`): {machine['machine']}, {machine['cpu']}, "
            f"{machine['cores']} cores, {machine['date']}; sgemm {machine['sgemm']['gflops']:.1f} GFLOP/s, "
            f"GELU {machine['elementwise']['gelu_ns']:.2f} ns and GELU' "
            f"{machine['elementwise']['gelu_grad_ns']:.2f} ns per element, copy "
            f"{machine['elementwise']['copy_gbps']:.1f} GB/s, optimizer "
            f"{machine['optimizer']['ns_per_param']:.3f} ns per param; collectives: {colls}.\n")
    md.append(
        "Predicted by `zeroshard estimate --machine machine.json --model mlp` (docs/estimator.md, "
        "\"Calibrated step time\"): one calibration for the machine, no per-row constants. "
        "*error* = (predicted - measured) / measured total; rows beyond "
        f"{MODEL_LIMIT:.0%} are flagged **over**. Measured parts: compute, exposed comm, "
        "optimizer, and the rest (input wait + engine other) beside the model's contention "
        "(waiting for a core). *cpus/rank*: the fewest CPUs a rank of the step run could use / "
        "what the model was given (`--cpus-per-rank`; *all*: not bound, the ranks share every "
        "core). Benchmarks on a shared machine are noisy: read the error "
        "with the neighbours' load in mind.\n")
    head = ["backend", "ranks", "stage", "cpus/rank meas / model", "compute meas / pred", "exposed comm meas / pred",
            "optimizer meas / pred", "input+other meas / contention pred", "total meas",
            "total pred", "error", ""]
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "---|" * len(head))
    over = []
    for r, p, cpus in rows:
        parts = r["parts_ms"]
        rest = parts.get("input_wait", 0.0) + parts.get("engine_other", 0.0)
        err = (p["total"] - r["total_ms"]) / r["total_ms"] if r["total_ms"] > 0 else float("nan")
        flag = "**over**" if not abs(err) <= MODEL_LIMIT else ""
        if flag:
            over.append(f"{r['backend']} {r['ranks']} ranks stage {r['stage']} ({err:+.0%})")
        cells = [r["backend"], r["ranks"], r["stage"],
                 f"{r.get('cpus', '-')} / {cpus or 'all'}",
                 f"{parts.get('compute', 0.0):.2f} / {p['compute']:.2f}",
                 f"{parts.get('exposed_comm', 0.0):.2f} / {p['exposed_comm']:.2f}",
                 f"{parts.get('optimizer', 0.0):.2f} / {p['optimizer']:.2f}",
                 f"{rest:.2f} / {p['contention']:.2f}",
                 f"{r['total_ms']:.2f}", f"{p['total']:.2f}", f"{err:+.1%}", flag]
        md.append("| " + " | ".join(str(c) for c in cells) + " |")
    within = len(rows) - len(over)
    md.append(f"\n{within} of {len(rows)} runs within {MODEL_LIMIT:.0%}"
              + (f"; beyond: {'; '.join(over)}." if over else ".") + "\n")
    return {"runs": len(rows), "within": within, "over": over}


def write_model_json(rows, summary, out_dir):
    data = {"limit": MODEL_LIMIT, "summary": summary, "rows": [
        {"backend": r["backend"], "ranks": r["ranks"], "stage": r["stage"],
         "measured_cpus": r.get("cpus"), "model_cpus_per_rank": cpus,
         "measured_ms": dict(r["parts_ms"], total=r["total_ms"]), "predicted_ms": p,
         "error": (p["total"] - r["total_ms"]) / r["total_ms"] if r["total_ms"] > 0 else None}
        for r, p, cpus in rows]}
    with open(os.path.join(out_dir, "model_vs_measured.json"), "w") as f:
        json.dump(data, f, indent=1)


# ---------------------------------------------------------- collective layer


def nominal_bytes(b):
    """The power of two a rounded size came from (64 MiB - 4 B on 3 ranks: 64 MiB)."""
    return 1 << round(math.log2(b))


def chart_collectives(data, path):
    ops = ["all_reduce", "reduce_scatter", "all_gather"]
    rows = data["results"]
    panel_w, panel_h = 330, 280
    svg = Svg(70 + 3 * (panel_w + 50), 460,
              f"Collectives, {data['backend']} backend: bus bandwidth vs size (nccl-tests busbw)")
    ranks = sorted({r["ranks"] for r in rows})
    sizes = sorted({nominal_bytes(r["bytes"]) for r in rows})
    lo, hi = math.log2(min(sizes)), math.log2(max(sizes))
    values = [r["busbw_gbps"] for r in rows] + [r["memcpy_gbps"] for r in rows]
    y_min = min(v for v in values if v > 0)
    y_max = max(values)
    # memcpy of the same bytes, one per size (the same for every op).
    mem = {}
    for r in rows:
        mem.setdefault(nominal_bytes(r["bytes"]), r["memcpy_gbps"])
    for i, op in enumerate(ops):
        left = 80 + i * (panel_w + 50)
        ax = LogAxes(svg, left, 60, panel_w, panel_h, y_min, y_max,
                     "GB/s (1e9 B/s), log scale" if i == 0 else "", "buffer size (log scale)")
        svg.text(left + panel_w / 2, 52, op.replace("_", "-"), size=13, anchor="middle",
                 weight="bold")

        def x_of(b):
            return left + 10 + (panel_w - 20) * (math.log2(b) - lo) / max(hi - lo, 1)

        step = max(1, (len(sizes) + 4) // 5)
        for k, b in enumerate(sizes):
            if k % step == 0 or b == sizes[-1]:
                svg.text(x_of(b), ax.y(0) + 16, human_bytes(b), size=10, anchor="middle")
        for k, n in enumerate(ranks):
            pts = sorted((nominal_bytes(r["bytes"]), r["busbw_gbps"]) for r in rows
                         if r["op"] == op and r["ranks"] == n)
            svg.polyline([(x_of(b), ax.y(v)) for b, v in pts], SERIES_COLOURS[k % len(SERIES_COLOURS)])
        svg.polyline([(x_of(b), ax.y(v)) for b, v in sorted(mem.items())], "#000", width=1.5,
                     dash="5,3", markers=False)
    entries = [(f"{n} ranks", SERIES_COLOURS[k % len(SERIES_COLOURS)], "line")
               for k, n in enumerate(ranks)]
    entries.append(("memcpy of the same bytes (1 thread; small sizes stay in cache)", "#000", "dash"))
    svg.legend(80, 420, entries, columns=len(entries), col_width=120)
    svg.save(path)


def collective_section(files, out_dir, md):
    md.append("## Collectives (collective_bench)\n")
    md.append("fp32 sums. *bytes*: the full buffer (all-reduce buffer, reduce-scatter input, "
              "all-gather output), as nccl-tests counts it. algbw = bytes / time; busbw = algbw x "
              "2(n-1)/n (all-reduce) or x (n-1)/n (reduce-scatter, all-gather). *memcpy*: one "
              "thread copies the same bytes in the same run; busbw/memcpy is how close the backend "
              "gets to the machine's own copy. Every result was checked bit for bit.\n")
    for data in files:
        name = f"collectives_{data['tag']}.svg"
        chart_collectives(data, os.path.join(out_dir, name))
        md.append(f"![collectives {data['tag']}]({name})\n")
    md.append("| backend | op | ranks | bytes | time us | algbw GB/s | busbw GB/s | memcpy GB/s "
              "| busbw/memcpy |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for data in files:
        # The table: 64 KiB, 64 MiB and the largest size (before rounding to a multiple of
        # the ranks); the JSON and the chart have every size.
        largest = max(nominal_bytes(r["bytes"]) for r in data["results"])
        for r in data["results"]:
            if nominal_bytes(r["bytes"]) not in (64 << 10, 64 << 20, largest):
                continue
            md.append(f"| {data['backend']} | {r['op']} | {r['ranks']} | {human_bytes(r['bytes'])} "
                      f"| {r['time_us']:.1f} | {r['algbw_gbps']:.3f} | {r['busbw_gbps']:.3f} "
                      f"| {r['memcpy_gbps']:.3f} | {r['busbw_over_memcpy']:.3f} |")
    md.append("")


# -------------------------------------------------------------- kernel layer


def chart_kernels(data, path):
    rows = data["results"]
    kernels = []
    for r in rows:
        if r["kernel"] not in kernels:
            kernels.append(r["kernel"])
    threads = sorted({r["threads"] for r in rows})
    row_h, panel_w = 30, 330
    height = 110 + len(kernels) * row_h + 40
    svg = Svg(230 + len(threads) * (panel_w + 40), height,
              "Kernels: GB/s against a copy, an in-place RMW and (AdamW) its own streams, "
              "same bytes (median)")
    series = [("kernel", "gbps", "#0072B2"), ("copy", "copy_gbps", "#999999"),
              ("RMW in place", "rmw_gbps", "#E69F00"),
              ("streams (AdamW)", "streams_gbps", "#009E73")]
    x_max = max(r[key]["median"] for r in rows for _, key, _ in series if key in r) * 1.05
    ticks = nice_ticks(x_max)
    for i, t in enumerate(threads):
        left = 220 + i * (panel_w + 40)
        top = 60
        svg.text(left + panel_w / 2, 50, f"{t} thread{'s' if t > 1 else ''}", size=13,
                 anchor="middle", weight="bold")
        for tick in ticks:
            x = left + panel_w * tick / ticks[-1]
            svg.line(x, top, x, top + len(kernels) * row_h, "#ddd")
            svg.text(x, top + len(kernels) * row_h + 14, fmt_tick(tick), size=11, anchor="middle")
        svg.text(left + panel_w / 2, top + len(kernels) * row_h + 32, "GB/s (1e9 B/s)", size=12,
                 anchor="middle")
        for k, name in enumerate(kernels):
            r = next((r for r in rows if r["kernel"] == name and r["threads"] == t), None)
            y = top + k * row_h + 3
            if i == 0:
                svg.text(left - 8, y + 16, name, size=12, anchor="end")
            if r is None:
                continue
            for s, (_, key, colour) in enumerate(series):
                if key in r:  # streams: the AdamW variants only
                    svg.rect(left, y + s * 6, panel_w * r[key]["median"] / ticks[-1], 5, colour)
        svg.line(left, top, left, top + len(kernels) * row_h)
    svg.legend(220, height - 12, [(label, colour, "box") for label, _, colour in series],
               columns=4, col_width=175)
    svg.save(path)


def kernel_section(data, out_dir, md):
    chart_kernels(data, os.path.join(out_dir, "kernels.svg"))
    md.append("## Kernels (adam_bench)\n")
    md.append(
        f"{data['elements']:,} elements, ISA path {data['isa']}, {data['rounds']} rounds of "
        "(copy, RMW, streams, kernel). *B/e*: bytes the kernel must read + write per element. "
        "*copy*: memcpy of B/e / 2 bytes per element; *RMW*: an in-place `x = 0.5x + 0.25` over "
        "B/e / 2 bytes per element (an in-place update's limit: no read-for-ownership); "
        "*streams* (AdamW only): the update's own streams with trivial arithmetic (gradient "
        "read, params and moments updated in place, 16-bit params written): the roofline of the "
        "same traffic. *vs copy*, *vs RMW*, *vs streams*: time ratio per round (above 1: faster "
        "than the baseline); median [min, max]. The norms only read, so the baselines are not "
        "their limit.\n")
    md.append("![kernels](kernels.svg)\n")
    md.append("| kernel | threads | B/e | GB/s | copy GB/s | RMW GB/s | streams GB/s | vs copy "
              "| vs RMW | vs streams |")
    md.append("|---|---|---|---|---|---|---|---|---|---|")

    def spread(x):
        return f"{x['median']:.3f} [{x['min']:.3f}, {x['max']:.3f}]"

    for r in data["results"]:
        streams = f"{r['streams_gbps']['median']:.2f}" if "streams_gbps" in r else "-"
        vs_streams = spread(r["vs_streams"]) if "vs_streams" in r else "-"
        md.append(f"| {r['kernel']} | {r['threads']} | {r['bytes_per_elem']} | {r['gbps']['median']:.2f} "
                  f"| {r['copy_gbps']['median']:.2f} | {r['rmw_gbps']['median']:.2f} | {streams} "
                  f"| {spread(r['vs_copy'])} | {spread(r['vs_rmw'])} | {vs_streams} |")
    md.append("")


# ------------------------------------------------------------- offload layer


def chart_offload(data, path):
    """Per precision and tier: the optimizer phase next to its limits, ms."""
    groups = []  # (label, [(series label, ms, colour)])
    for r in data["results"]:
        if "host" in r:
            h = r["host"]
            groups.append((f"{r['precision']} host", [
                ("phase", h["phase_s"]["median"], "#0072B2"),
                ("AdamW alone", h["adamw_s"]["median"], "#E69F00"),
                ("copies alone", h["copies_s"]["median"], "#999999"),
                ("streams baseline", h["streams_s"]["median"], "#009E73")]))
        if "nvme" in r:
            n = r["nvme"]
            groups.append((f"{r['precision']} NVMe", [
                ("phase", n["phase_s"]["median"], "#0072B2"),
                ("AdamW alone", n["adamw_s"]["median"], "#E69F00"),
                ("disk read + write", n["disk_s"], "#CC79A7")]))
    row_h, panel_w = 34, 560
    height = 100 + len(groups) * row_h + 40
    svg = Svg(230 + panel_w + 60, height,
              "Offload: the optimizer phase against its limits, same run (ms, median)")
    x_max = max((ms for _, bars in groups for _, ms, _ in bars), default=1e-3) * 1e3 * 1.05
    ticks = nice_ticks(x_max)
    left, top = 220, 50
    for tick in ticks:
        x = left + panel_w * tick / ticks[-1]
        svg.line(x, top, x, top + len(groups) * row_h, "#ddd")
        svg.text(x, top + len(groups) * row_h + 14, fmt_tick(tick), size=11, anchor="middle")
    svg.text(left + panel_w / 2, top + len(groups) * row_h + 32, "ms", size=12, anchor="middle")
    for g, (label, bars) in enumerate(groups):
        y = top + g * row_h + 3
        svg.text(left - 8, y + 16, label, size=12, anchor="end")
        for b, (_, ms, colour) in enumerate(bars):
            svg.rect(left, y + b * 7, panel_w * ms * 1e3 / ticks[-1], 6, colour)
    svg.line(left, top, left, top + len(groups) * row_h)
    legend = [("phase", "#0072B2"), ("AdamW alone", "#E69F00"), ("copies alone", "#999999"),
              ("streams baseline", "#009E73"), ("disk read + write", "#CC79A7")]
    svg.legend(20, height - 12, [(l, c, "box") for l, c in legend], columns=5, col_width=160)
    svg.save(path)


def offload_section(data, out_dir, md):
    chart_offload(data, os.path.join(out_dir, "offload.svg"))
    md.append("## Offload (offload_bench)\n")
    md.append(
        f"CPU {data['cpu']}. {data['params']:,} params in {data['units']} units, chunks of "
        f"{data['chunk']:,} elements, {data['repeats']} interleaved repeats (median [min, max], ms). "
        "*Host tier*: *phase* = the optimizer phase (gradients to the host, params back, the CPU "
        "AdamW, chunk by chunk); *AdamW* and *copies* = the same with the update or the copies "
        "alone; *streams* = the update's same-traffic streams baseline; *ratio* = phase / "
        "max(AdamW, copies); *hidden* = the copies' hidden fraction, 1 - (phase - AdamW) / "
        "copies, clamped to [0, 1]. *NVMe tier*: *disk* = sequential read + write of the same "
        "bytes through the swap files' own I/O path; *ratio* = phase / max(AdamW, disk), "
        f"checked against {data['limit']}. Ratios and the hidden fraction are taken per repeat "
        f"(paired) and their median shown. I/O: {data['io_backend']}.\n")
    md.append("![offload](offload.svg)\n")

    def ms(x):
        return f"{x['median'] * 1e3:.1f} [{x['min'] * 1e3:.1f}, {x['max'] * 1e3:.1f}]"

    md.append("| precision | tier | phase | AdamW | copies / I/O | streams / disk | ratio | hidden "
              "/ check |")
    md.append("|---|---|---|---|---|---|---|---|")
    for r in data["results"]:
        if "host" in r:
            h = r["host"]
            md.append(f"| {r['precision']} | host | {ms(h['phase_s'])} | {ms(h['adamw_s'])} "
                      f"| {ms(h['copies_s'])} | {ms(h['streams_s'])} | {h['ratio']:.3f} "
                      f"| {h['hidden']:.3f} |")
        if "nvme" in r:
            n = r["nvme"]
            md.append(f"| {r['precision']} | NVMe | {ms(n['phase_s'])} | {ms(n['adamw_s'])} "
                      f"| {ms(n['io_s'])} | {n['disk_s'] * 1e3:.1f} | {n['ratio']:.3f} "
                      f"| {'PASS' if n['pass'] else 'FAIL'} (<= {data['limit']}) |")
    dd = data.get("dd", {})
    if dd.get("ran"):
        md.append(f"\n`dd` reference ({dd['note']}): {dd['bytes'] / 2**20:.1f} MiB written in "
                  f"{dd['write_s'] * 1e3:.1f} ms, read in {dd['read_s'] * 1e3:.1f} ms.\n")
    rows = data.get("step", {}).get("rows", [])
    if rows:
        m = data["step"]["model"]
        md.append(f"Training step, mlp_demo model {m['blocks']} blocks x hidden {m['hidden']}, "
                  f"micro-batch {m['micro_batch']}, 1 rank, stage 1; median of "
                  f"{data['step']['repeats']} interleaved repeats of {data['step']['steps']} steps "
                  "(the overhead per repeat against the device tier's, then the median).\n")
        md.append("| precision | tier | step ms | optimizer ms | overhead | device B | host B | NVMe B "
                  "| ledger = plan | losses equal |")
        md.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            b = r["plan_bytes"]
            md.append(f"| {r['precision']} | {r['tier']} | {r['step_ms']['median']:.2f} "
                      f"| {r['optimizer_ms']:.2f} | {r['overhead_pct']:.1f}% | {b['device']:,} "
                      f"| {b['host']:,} | {b['nvme']:,} | {'yes' if r['ledger_equals_plan'] else 'NO'} "
                      f"| {'yes' if r['losses_equal'] else 'NO'} |")
    md.append("")


# ------------------------------------------------------------------ markdown


def md_to_html(lines, title):
    """The report's own Markdown subset (headings, paragraphs, tables, images)."""
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:DejaVu Sans,Arial,sans-serif;max-width:1400px;margin:20px;}"
           "table{border-collapse:collapse;font-size:13px;margin:8px 0;}"
           "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right;}"
           "td:first-child,th:first-child{text-align:left;} img{display:block;margin:10px 0;}"
           "code{background:#f3f3f3;}</style></head><body>"]
    table = None

    def inline(text):
        text = html.escape(text)
        parts = text.split("`")
        text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
        parts = text.split("*")
        return "".join(f"<em>{p}</em>" if i % 2 else p for i, p in enumerate(parts))

    for line in "\n".join(lines).split("\n"):
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            if table is None:
                table = []
                out.append("<table><tr>" + "".join(f"<th>{inline(c)}</th>" for c in cells) + "</tr>")
            else:
                out.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if table is not None:
            out.append("</table>")
            table = None
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("![") and "](" in line:
            alt = line[2:line.index("]")]
            src = line[line.index("](") + 2:line.rindex(")")]
            out.append(f'<img src="{html.escape(src)}" alt="{html.escape(alt)}">')
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    if table is not None:
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="build/perf", help="where the JSON files are and the report goes")
    parser.add_argument("--check", action="store_true", help="validate what was written")
    parser.add_argument("--expect", default="",
                        help="layers --check requires: step,collectives,kernels,model,offload,multinode")
    parser.add_argument("--cpus-per-rank", nargs=2, metavar=("BACKEND", "RANKS"),
                        help="print the binding the step run measured for `estimate --cpus-per-rank` "
                             "(0: not bound) and write nothing")
    args = parser.parse_args()
    out_dir = args.dir
    if args.cpus_per_rank:
        backend, ranks = args.cpus_per_rank[0], int(args.cpus_per_rank[1])
        machine_path = os.path.join(out_dir, "machine.json")
        machine = load(machine_path) if os.path.exists(machine_path) else None
        step_files = [d for d in (load(p) for p in sorted(
            glob.glob(os.path.join(out_dir, "step_*.json")))) if d]
        print(measured_cpus_per_rank(step_files, backend, ranks, (machine or {}).get("cores", 0)))
        return 0
    md = ["# zeroshard performance report\n",
          "Written by `make perf` (docs/perf.md says how to read it). Ratios come from one run; "
          "on a shared machine absolute speeds vary from run to run, ratios measured in the same "
          "run much less.\n"]
    layers = []

    step_files = [d for d in (load(p) for p in sorted(glob.glob(os.path.join(out_dir, "step_*.json")))) if d]
    if step_files:
        runs = step_runs(step_files)
        parts = [p for p in step_files[0]["parts"]
                 if any(r["parts_ms"].get(p, 0.0) > 0 for r in runs)] or step_files[0]["parts"]
        step_section(runs, parts, step_files[0], out_dir, md)
        layers.append("step")
        predicted = [d for d in (load(p) for p in sorted(
            glob.glob(os.path.join(out_dir, "predicted_*.json")))) if d]
        rows = model_rows(runs, predicted)
        if rows:
            machine_path = os.path.join(out_dir, "machine.json")
            machine = load(machine_path) if os.path.exists(machine_path) else None
            write_model_json(rows, model_section(rows, machine, out_dir, md), out_dir)
            layers.append("model")
        else:
            md.append("## Calibrated model\n\nNo predicted_*.json matching the step runs: "
                      "`zeroshard calibrate` or `estimate --machine` did not run.\n")
    else:
        md.append("## Engine step\n\nNo step_*.json in this directory: step_bench did not run.\n")

    coll = []
    for p in sorted(glob.glob(os.path.join(out_dir, "collectives_*.json"))):
        data = load(p)
        if data:
            data["tag"] = os.path.basename(p)[len("collectives_"):-len(".json")]
            coll.append(data)
    if coll:
        collective_section(coll, out_dir, md)
        layers.append("collectives")
    else:
        md.append("## Collectives\n\nNo collectives_*.json: collective_bench did not run.\n")

    kernels = load(os.path.join(out_dir, "kernels.json")) if os.path.exists(
        os.path.join(out_dir, "kernels.json")) else None
    if kernels:
        kernel_section(kernels, out_dir, md)
        layers.append("kernels")
    else:
        md.append("## Kernels\n\nNo kernels.json: adam_bench did not run.\n")

    offload_path = os.path.join(out_dir, "offload.json")
    offload = load(offload_path) if os.path.exists(offload_path) else None
    if offload:
        offload_section(offload, out_dir, md)
        layers.append("offload")
    else:
        md.append("## Offload\n\nNo offload.json: offload_bench did not run.\n")

    zeropp_path = os.path.join(out_dir, "multinode_zeropp.json")
    zeropp = load(zeropp_path) if os.path.exists(zeropp_path) else None
    if zeropp and zeropp.get("rows"):
        from multinode_section import multinode_section
        multinode_section(zeropp, out_dir, md, Svg, nice_ticks)
        layers.append("multinode")
    else:
        md.append("## ZeRO++ across emulated nodes\n\nNo multinode_zeropp.json: "
                  "perf/multinode/zeropp_bench.sh did not run (it needs root and mpirun).\n")

    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(md_to_html(md, "zeroshard performance report"))
    svgs = sorted(glob.glob(os.path.join(out_dir, "*.svg")))
    print(f"make_report: wrote {os.path.join(out_dir, 'report.md')}, report.html and "
          f"{len(svgs)} charts ({', '.join(layers) or 'no layers'})")
    if args.check:
        bad = []
        for path in svgs:
            try:
                ElementTree.parse(path)
            except ElementTree.ParseError as error:
                bad.append(f"{path}: {error}")
        if not layers:
            bad.append("no layer's JSON found")
        for layer in filter(None, args.expect.split(",")):
            if layer not in layers:
                bad.append(f"layer {layer}: no readable JSON in {out_dir}")
        for problem in bad:
            print(f"make_report: check failed: {problem}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
