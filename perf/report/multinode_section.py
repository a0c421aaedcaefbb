"""The ZeRO++ section of make perf's report (perf/multinode/zeropp_bench.sh's
multinode_zeropp.json): bytes across nodes per step and step time for each
ZeRO++ option, shape and link, against the exact run of the same shape and
link. make_report.py passes its Svg writer and tick helper."""

import os

COLOURS = {"exact": "#4c72b0", "qwz": "#dd8452", "hpz": "#55a868", "qwz,hpz": "#c44e52",
           "qgz8": "#8172b3", "qgz4": "#da8bc3", "qwz,hpz,qgz8": "#937860",
           "qwz,hpz,qgz4": "#8c8c8c"}


def chart_bytes(rows, path, svg_class, nice_ticks):
    groups = []
    for r in rows:
        key = (r["shape"], r["link"])
        if key not in groups:
            groups.append(key)
    options = []
    for r in rows:
        if r["options"] not in options:
            options.append(r["options"])
    # About 25 px per bar, so that each bar's "0.21x" label fits above it.
    plot_w = max(640, 25 * len(options) * len(groups) * 5 // 4)
    width, height = plot_w + 120, 400
    left, top, plot_h = 80, 50, 260
    svg = svg_class(width, height, "Bytes across nodes per step (engine counters), stage 3")
    top_value = max(r["inter_node_bytes_per_step"] for r in rows) / 1e6
    ticks = nice_ticks(top_value)
    y_max = ticks[-1] if ticks else top_value
    y = lambda v: top + plot_h - plot_h * v / y_max  # noqa: E731
    for t in ticks:
        svg.line(left, y(t), left + plot_w, y(t), stroke="#ddd")
        svg.text(left - 6, y(t) + 4, f"{t:g}", size=11, anchor="end")
    svg.text(18, top + plot_h / 2, "MB per step", size=12, anchor="middle", rotate=-90)
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / max(1, len(options))
    by_key = {(r["shape"], r["link"], r["options"]): r for r in rows}
    for g, (shape, link) in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for k, opt in enumerate(options):
            r = by_key.get((shape, link, opt))
            if r is None:
                continue
            v = r["inter_node_bytes_per_step"] / 1e6
            svg.rect(x0 + k * bar_w, y(v), bar_w * 0.9, top + plot_h - y(v), COLOURS.get(opt, "#888"))
            svg.text(x0 + k * bar_w + bar_w * 0.45, y(v) - 4, f"{r['bytes_vs_exact']:.2f}x", size=8,
                     anchor="middle")
        svg.text(left + g * group_w + group_w / 2, top + plot_h + 18, f"{shape}, {link}", size=12,
                 anchor="middle")
    svg.line(left, top + plot_h, left + plot_w, top + plot_h)
    svg.legend(left, top + plot_h + 50, [(o, COLOURS.get(o, "#888"), "box") for o in options],
               columns=4, col_width=150)
    svg.save(path)


def multinode_section(data, out_dir, md, svg_class, nice_ticks):
    rows = data["rows"]
    chart_bytes(rows, os.path.join(out_dir, "multinode_zeropp.svg"), svg_class, nice_ticks)
    steps = rows[0]["steps"] if rows else 0
    md.append("## ZeRO++ across emulated nodes (zeropp_bench.sh)\n")
    md.append(
        f"CPU {data.get('cpu', 'unknown')}. `mlp_demo --backend mpi --stage 3 --steps {steps}` on "
        "the emulated cluster (tests/multinode/zs_cluster.sh: network namespaces, Open MPI over "
        "TCP between nodes; every node shares this machine's cores), 2 nodes x 2 ranks and 4 x 1, "
        "links unshaped and shaped to 1 Gbit/s (tbf). *Engine* = the bytes each rank sent to ranks "
        "on other nodes (Communicator::traffic: collectives and qgZ's Sends, all ranks) per "
        "step; *interfaces* = all nodes' "
        "eth0 tx per step (payload plus TCP/IP and Open MPI headers and the launcher's "
        "messages); *vs exact* = against the exact run of the same shape and link; *speed-up* = "
        "the exact run's step time / this one's; *loss* = the largest relative difference from "
        "the one-rank baseline's loss over the run (exact and hpZ are bitwise).\n")
    md.append("![zeropp](multinode_zeropp.svg)\n")
    md.append("| shape | link | options | engine MB/step | vs exact | interfaces MB/step | vs exact "
              "| step ms | speed-up | loss |")
    md.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        md.append(f"| {r['shape']} | {r['link']} | {r['options']} "
                  f"| {r['inter_node_bytes_per_step'] / 1e6:.3f} | {r['bytes_vs_exact']:.3f} "
                  f"| {r['interface_tx_bytes_per_step'] / 1e6:.3f} | {r['interface_vs_exact']:.3f} "
                  f"| {r['step_ms']:.1f} | {r['exact_over_step_time']:.2f} "
                  f"| {r['loss_max_rel_diff']:.4f} |")
    md.append("")
