#!/usr/bin/env python3
"""Draw an ote_bench sweep: GB/s and p99 latency against block size, to a PNG.

    ote_bench --json -b 4K,64K,1M,16M --transport tcp > tcp.json
    ote_bench --json -b 4K,64K,1M,16M --transport shm > shm.json
    tools/plot_bench.py tcp.json shm.json -o sweep.png --size 1200x800

Reads ote_bench's --json lines (files, or stdin with "-" or no file; lines that are not
a JSON object are skipped, so a log may be piped in as it is). One line per series: the
results that share transport, op, local and remote memory kind, path, batch size and
thread count; the legend names only the fields that differ between the series. The
upper panel is throughput (GB/s), the lower one p99 latency (microseconds, log scale),
both against block size (log 2 scale). Needs matplotlib (Debian: python3-matplotlib);
draws with the Agg backend, so no display is needed. Exits 1 (with a message) when no
result line was read, 2 on a bad argument.
"""

import argparse
import json
import sys

SERIES_KEYS = ("transport", "op", "local_mem", "remote_mem", "path", "batch_size", "threads")


def parse_lines(lines):
    """The result objects among lines (anything else is skipped)."""
    rows = []
    for line in lines:
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "block_size" in row and "gbps" in row:
            rows.append(row)
    return rows


def read_results(paths):
    """The result objects of every --json line in paths ("-": stdin)."""
    rows = []
    for path in paths or ["-"]:
        if path == "-":
            rows += parse_lines(sys.stdin)
            continue
        with open(path, encoding="utf-8") as f:
            rows += parse_lines(f)
    return rows


def group(rows):
    """{series key tuple: [rows sorted by block size]} and the keys that vary."""
    varying = [k for k in SERIES_KEYS if len({str(r.get(k)) for r in rows}) > 1]
    series = {}
    for r in rows:
        series.setdefault(tuple(str(r.get(k)) for k in SERIES_KEYS), []).append(r)
    for v in series.values():
        v.sort(key=lambda r: r["block_size"])
    return series, varying


def label(key, varying):
    fields = dict(zip(SERIES_KEYS, key))
    shown = varying or ["transport"]
    names = {"local_mem": "local", "remote_mem": "remote", "batch_size": "batch"}
    parts = []
    for k in shown:
        if k in ("transport", "op"):
            parts.append(fields[k])
        else:
            parts.append("%s=%s" % (names.get(k, k), fields[k]))
    return " ".join(parts)


def size_name(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def parse_size(text):
    try:
        w, h = text.lower().split("x")
        w, h = int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError("--size wants WIDTHxHEIGHT in pixels, e.g. 1200x800")
    if not (100 <= w <= 10000 and 100 <= h <= 10000):
        raise argparse.ArgumentTypeError("--size: each side between 100 and 10000 pixels")
    return w, h


def plot(rows, out, size, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, varying = group(rows)
    dpi = 100
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(size[0] / dpi, size[1] / dpi),
                                      dpi=dpi)
    blocks = sorted({r["block_size"] for r in rows})
    for key in sorted(series):
        pts = series[key]
        xs = [r["block_size"] for r in pts]
        name = label(key, varying)
        top.plot(xs, [r["gbps"] for r in pts], marker="o", label=name)
        bottom.plot(xs, [max(r["lat_p99_us"], 1e-3) for r in pts], marker="o", label=name)
    top.set_ylabel("GB/s")
    top.set_ylim(bottom=0)
    top.grid(True, alpha=0.3)
    top.legend(fontsize="small")
    bottom.set_ylabel("p99 latency (us)")
    bottom.set_yscale("log")
    bottom.set_xlabel("block size")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(blocks)
    bottom.set_xticklabels([size_name(b) for b in blocks], rotation=45 if len(blocks) > 8 else 0)
    top.set_title(title or "ote_bench")
    fig.tight_layout()
    fig.savefig(out, dpi=dpi, format="png")  # no bbox_inches: the PNG is exactly --size
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="ote_bench --json output files ('-': stdin)")
    ap.add_argument("-o", "--output", required=True, help="PNG file to write")
    ap.add_argument("--size", type=parse_size, default=(1200, 800), help="WIDTHxHEIGHT pixels")
    ap.add_argument("--title", default="", help="title above the plots")
    args = ap.parse_args(argv)
    try:
        rows = read_results(args.inputs)
    except OSError as e:
        print("plot_bench: %s" % e, file=sys.stderr)
        return 1
    if not rows:
        print("plot_bench: no ote_bench --json result line in the input", file=sys.stderr)
        return 1
    plot(rows, args.output, args.size, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
