#!/usr/bin/env python3
"""Draws the benchmark report's plots from the CSVs the bench scripts write.

    .venv-bench/bin/python bench/plots.py --data build/bench --out docs/img

Each plot is drawn only when its CSV is there (and a stale PNG of a section
without data is removed, so the report never shows an old picture):
  latency_mlserver.png  p50/p99 vs throughput, kiln (JSON, binary) and MLServer
  latency_cache.png     p50/p99 vs throughput for the cache configurations
  http.png              kiln vs the ceiling under wrk: throughput and p99
  batching.png          throughput and p99 per batching mode and concurrency
  engine.png            kiln vs onnxruntime median latency per model and batch
  hash.png              hash throughput by input size
  modelset.png          kiln / onnxruntime latency ratio per model of the real-model set
  modelset_avx2.png     the same, with the CPU seen as AVX2-only by both engines
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(data, name):
    path = os.path.join(data, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows or None


def save(fig, out, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    print(f"plots: {name}")


def drop(out, name):
    p = os.path.join(out, name)
    if os.path.exists(p):
        os.remove(p)
        print(f"plots: {name} removed (no data)")


def latency_vs_throughput(rows, series_key, label_of, title, out, name):
    """Two panels (p50, p99) of latency against throughput, one line per
    series, each point labelled with its concurrency."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series = []
    for r in rows:
        k = series_key(r)
        if k not in series:
            series.append(k)
    for ax, (col, qname) in zip(axes, (("p50_us", "p50"), ("p99_us", "p99"))):
        for k in series:
            pts = sorted((int(r["concurrency"]), float(r["throughput"]), float(r[col]) / 1000)
                         for r in rows if series_key(r) == k)
            xs, ys = [p[1] for p in pts], [p[2] for p in pts]
            line, = ax.plot(xs, ys, marker="o", label=label_of(k))
            for c, x, y in pts:
                ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("throughput (requests/s, log)")
        ax.set_ylabel(f"{qname} latency (ms, log)")
        ax.set_title(f"{qname} vs throughput")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    save(fig, out, name)


def plot_mlserver(data, out):
    rows = read(data, "mlserver.csv")
    if not rows:
        return drop(out, "latency_mlserver.png")
    latency_vs_throughput(rows, lambda r: (r["server"], r["protocol"]),
                          lambda k: f"{k[0]} ({k[1]})", "digits model, kiln bench closed loop", out,
                          "latency_mlserver.png")


def plot_cache(data, out):
    rows = read(data, "cache.csv")
    if not rows:
        return drop(out, "latency_cache.png")
    # Without any server-side hit the cache rows would be mislabelled: show only
    # what the report shows then (the ceiling and the uncached path).
    if sum(int(r["cache_hits"]) for r in rows if r["config"] in ("tier1_hits", "redis_hits")) == 0:
        rows = [r for r in rows if r["config"] in ("ceiling", "disabled")]
    latency_vs_throughput(rows, lambda r: r["config"], lambda k: k.replace("_", " "),
                          "result cache paths vs the ceiling (digits, kiln bench)", out, "latency_cache.png")


def grouped_bars(ax, groups, series, value, ylabel, log=False):
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, s in enumerate(series):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        vals = [value(grp, s) for grp in groups]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width, label=s)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([str(g) for g in groups])
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(True, axis="y", alpha=0.3)


def plot_http(data, out):
    rows = read(data, "http.csv")
    if not rows:
        return drop(out, "http.png")
    by = {(r["server"], int(r["concurrency"])): r for r in rows}
    cs = sorted({int(r["concurrency"]) for r in rows})
    servers = sorted({r["server"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    get = lambda col: (lambda c, s: float(by[(s, c)][col]) if (s, c) in by else None)
    grouped_bars(axes[0], cs, servers, get("rps"), "requests/s")
    grouped_bars(axes[1], cs, servers, get("p99_ms"), "p99 ms (log)", log=True)
    for ax in axes:
        ax.set_xlabel("concurrency (connections)")
    axes[0].legend(fontsize=8)
    fig.suptitle("HTTP front end under wrk: kiln (digits) vs the fixed-answer ceiling")
    save(fig, out, "http.png")


def plot_batching(data, out):
    rows = read(data, "batching.csv")
    if not rows:
        return drop(out, "batching.png")
    # Closed-loop rows only (load "c=N"); open-loop rows ("rate=R") are in the table.
    norm = []
    for r in rows:
        load = r.get("load") or f"c={r.get('concurrency', '')}"
        if not load.startswith("c="):
            continue
        norm.append(dict(r, concurrency=load[2:], rps=r.get("throughput") or r.get("rps")))
    rows = norm
    if not rows:
        return drop(out, "batching.png")
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        mr = [r for r in rows if r["model"] == m]
        by = {(r["mode"], int(r["concurrency"])): r for r in mr}
        cs = sorted({int(r["concurrency"]) for r in mr})
        modes = [md for md in ("off", "on", "delay", "budget") if any(r["mode"] == md for r in mr)]
        get = lambda col: (lambda c, md: float(by[(md, c)][col]) if (md, c) in by else None)
        grouped_bars(row[0], cs, modes, get("rps"), "requests/s")
        grouped_bars(row[1], cs, modes, get("p99_ms"), "p99 ms (log)", log=True)
        # Mean batch size over the throughput bars: the effect being measured.
        n = len(modes)
        width = 0.8 / max(n, 1)
        for i, md in enumerate(modes):
            for gi, c in enumerate(cs):
                r = by.get((md, c))
                if r:
                    row[0].annotate(f"b={float(r['mean_batch']):.1f}", (gi + (i - (n - 1) / 2) * width, float(r["rps"])),
                                    ha="center", va="bottom", fontsize=6)
        for ax in row:
            ax.set_xlabel("concurrency")
            ax.set_title(m)
        row[0].legend(fontsize=8, title="batching", title_fontsize=8)
    fig.suptitle("Dynamic batching: throughput (with mean batch size) and p99")
    save(fig, out, "batching.png")


def plot_engine(data, out):
    rows = read(data, "engine.csv")
    if not rows:
        return drop(out, "engine.png")
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.8), squeeze=False)
    for ax, m in zip(axes[0], models):
        mr = [r for r in rows if r["model"] == m]
        bs = [r["batch"] for r in mr]
        by = {r["batch"]: r for r in mr}
        grouped_bars(ax, bs, ["kiln", "onnxruntime"],
                     lambda b, s: float(by[b]["kiln_p50_ms" if s == "kiln" else "ort_p50_ms"]), "median latency (ms)")
        for gi, b in enumerate(bs):
            top = max(float(by[b]["kiln_p50_ms"]), float(by[b]["ort_p50_ms"]))
            ax.annotate(f"{float(by[b]['ratio']):.2f}x", (gi, top), ha="center", va="bottom", fontsize=8)
        ax.set_xlabel("batch size")
        ax.set_title(m)
        ax.legend(fontsize=8)
    fig.suptitle("Engine: median latency per call, same thread count (label: kiln / onnxruntime)")
    save(fig, out, "engine.png")


def plot_hash(data, out):
    rows = read(data, "hash.csv")
    if not rows:
        return drop(out, "hash.png")
    algos = []
    for r in rows:
        if r["algorithm"] not in algos:
            algos.append(r["algorithm"])
    sizes = sorted({int(r["bytes"]) for r in rows})
    names = {256: "256 B", 4096: "4 KiB", 1 << 20: "1 MiB"}
    by = {(r["algorithm"], int(r["bytes"])): float(r["mb_per_s"]) for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4))
    grouped_bars(ax, [names.get(s, str(s)) for s in sizes], algos,
                 lambda g, a: by.get((a, [s for s in sizes if names.get(s, str(s)) == g][0])), "MB/s")
    ax.set_xlabel("input size")
    ax.legend(fontsize=7)
    ax.set_title("Cache key candidates: single-thread hash throughput")
    save(fig, out, "hash.png")


def plot_modelset(data, out, name="modelset", cpu=""):
    rows = [r for r in (read(data, name + ".csv") or []) if r["status"] == "ok"]
    if not rows:
        return drop(out, name + ".png")
    models = list(dict.fromkeys(r["model"] for r in rows))
    threads = sorted({r["threads"] for r in rows}, key=int)
    by = {(r["model"], r["threads"]): float(r["ratio"]) for r in rows}
    kind = {r["model"]: r["kind"] for r in rows}
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(models) + 1.5))
    h = 0.8 / len(threads)
    for i, t in enumerate(threads):
        ys = [k + (i - (len(threads) - 1) / 2) * h for k in range(len(models))]
        ax.barh(ys, [by.get((m, t), 0) for m in models], height=h, label=f"{t} thread{'s' if t != '1' else ''}")
    ax.set_yticks(range(len(models)))
    ax.set_yticklabels([m + (" (INT8)" if kind[m] == "int8" else "") for m in models], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1, color="black", lw=0.8)
    ax.axvline(1.25, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("kiln / onnxruntime median latency (log; < 1: kiln faster; dashed: 1.25)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Engine on the real-model set: kiln CPU / onnxruntime CPU, same threads" + cpu)
    save(fig, out, name + ".png")


def plot_modelset_avx2(data, out):
    plot_modelset(data, out, "modelset_avx2", ", AVX2-only CPU")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="build/bench", help="folder of the bench CSVs")
    ap.add_argument("--out", default="docs/img", help="folder for the PNGs")
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"plots: no data folder {a.data}")
    os.makedirs(a.out, exist_ok=True)
    failed = 0
    for f in (plot_mlserver, plot_cache, plot_http, plot_batching, plot_engine, plot_hash,
              plot_modelset, plot_modelset_avx2):
        try:
            f(a.data, a.out)
        except (KeyError, ValueError, IndexError) as e:
            # A malformed CSV is a failed plot, named, not a crash of the others.
            print(f"plots: {f.__name__}: bad data: {e!r}", file=sys.stderr)
            failed = 1
    sys.exit(failed)


if __name__ == "__main__":
    main()
