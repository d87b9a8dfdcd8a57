#!/usr/bin/env python3
"""kiln CPU vs onnxruntime CPU, and OpenVINO CPU where it is installed, on the
real-model set (bench/models/make_set.py).

For each model and each thread count, alternating rounds of kiln (`kiln run
--backend cpu --iterations N`, the engine alone: its own p50 over the timed
calls, loading and planning excluded) and onnxruntime (InferenceSession.run()
in this process, same intra-op thread count, sequential execution), both on
the model's saved seeded inputs; the median over rounds of each side's p50.
The first kiln round also writes kiln's outputs, compared with the saved
onnxruntime outputs (the largest absolute difference), so a wrong or refused
model shows in the same table.

    .venv/bin/python bench/modelset.py --set build/modelset --kiln build/kiln
        [--threads 1,2] [--rounds 3] [--budget-ms 300] [--only NAME,...]
        [--csv OUT.csv] > OUT.md

--budget-ms sizes each side's timed loop (iterations = budget / one call's
time, 5 to 200). Prints markdown: the table, then the summary (median ratio
over the float models, the worst, the INT8 models apart).

OpenVINO (--openvino-python, default .venv-bench's Python, which
requirements-bench.txt gives openvino; "" leaves it out) runs as a third
side in each round through bench/openvino_worker.py: FP32 precision hint,
latency hint, the same thread count, static input shapes. Its outputs are
compared with onnxruntime's too. The ratio against the better of the two
peers per model is reported beside the ratio against onnxruntime.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_vs_ort import ort_p50  # noqa: E402  (one timing loop for both engine benchmarks)


def load(folder):
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    meta["feeds"] = {k: np.load(os.path.join(folder, "inputs", f"{k}.npy")) for k in meta["inputs"]}
    meta["model"] = os.path.join(folder, "model.onnx")
    meta["folder"] = folder
    return meta


def kiln_run(kiln, meta, threads, iterations, outdir=None):
    """kiln's p50 in ms, or raises RuntimeError with kiln's message."""
    args = [kiln, "run", meta["model"], "--backend", "cpu", "--threads", str(threads), "--quiet",
            "--iterations", str(iterations)]
    for k in meta["inputs"]:
        args += ["--input", f"{k}={os.path.join(meta['folder'], 'inputs', k + '.npy')}"]
    if outdir:
        args += ["--output-dir", outdir]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    text = (r.stdout + r.stderr).strip()
    m = re.search(r"p50\s+([0-9.]+)\s*ms", text)
    if r.returncode != 0 or not m:
        raise RuntimeError(" ".join(text.splitlines()[-3:]) or f"exit {r.returncode}")
    return float(m.group(1))


def ort_session(meta, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(meta["model"], so, providers=["CPUExecutionProvider"])


def max_error(meta, outdir, by_position=False):
    worst = 0.0
    for k in meta["outputs"]:
        ref = np.load(os.path.join(meta["folder"], "outputs", k.replace("/", "_") + ".npy"))
        path = os.path.join(outdir, k.replace("/", "_") + ".npy")
        if by_position and not os.path.exists(path):  # OpenVINO renames some outputs
            path = os.path.join(outdir, f"#{meta['outputs'].index(k)}.npy")
        got = np.load(path)
        if got.shape != ref.shape:
            raise RuntimeError(f"output {k}: shape {list(got.shape)}, onnxruntime {list(ref.shape)}")
        worst = max(worst, float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()))
    return worst


class OpenVINO:
    """An openvino_worker.py process for one model and thread count."""

    def __init__(self, python, meta, threads):
        self.p = subprocess.Popen([python, os.path.join(ROOT, "bench", "openvino_worker.py"), meta["model"],
                                   str(threads), os.path.join(meta["folder"], "inputs"), ",".join(meta["inputs"])],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.error = self._answer("ready")

    def _answer(self, want):
        line = (self.p.stdout.readline() or "error: the OpenVINO worker exited").strip()
        return None if line.startswith(want) else line

    def p50(self, iterations):
        self.p.stdin.write(f"time {iterations}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        if not line.startswith("p50 "):
            raise RuntimeError(line or "the OpenVINO worker exited")
        return float(line.split()[1])

    def outputs(self, folder):
        self.p.stdin.write(f"outputs {folder}\n")
        self.p.stdin.flush()
        err = self._answer("ok")
        if err:
            raise RuntimeError(err)

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def bench_model(a, meta, threads):
    """One row: kiln's and onnxruntime's medians over rounds (or the error
    kiln gave), and OpenVINO's as (median, difference from onnxruntime) or
    (None, why not)."""
    sess = ort_session(meta, threads)
    feeds = meta["feeds"]
    a0 = time.perf_counter()
    sess.run(None, feeds)
    one = (time.perf_counter() - a0) * 1e3
    iters = int(min(200, max(5, a.budget_ms / max(one, 1e-3))))
    ks, os_, vs = [], [], []
    err, ov_err, ov_why = None, None, "not run (no --openvino-python)"
    ov = OpenVINO(a.openvino_python, meta, threads) if a.openvino_python else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if ov:
                ov_why = ov.error
                if not ov_why:
                    try:
                        ovdir = os.path.join(tmp, "openvino")
                        os.makedirs(ovdir)
                        ov.outputs(ovdir)
                        ov_err = max_error(meta, ovdir, by_position=True)
                    except RuntimeError as e:
                        ov_why = str(e)
            for r in range(a.rounds):
                # Rotate which side goes first, so a neighbour's burst costs each.
                sides = ("kiln", "ort", "ov")[r % 3:] + ("kiln", "ort", "ov")[:r % 3]
                for s in sides:
                    if s == "ort":
                        os_.append(ort_p50(sess, feeds, iters))
                    elif s == "kiln":
                        ks.append(kiln_run(a.kiln, meta, threads, iters, tmp if r == 0 else None))
                        if r == 0:
                            err = max_error(meta, tmp)
                    elif ov and not ov_why:
                        try:
                            vs.append(ov.p50(iters))
                        except RuntimeError as e:
                            ov_why = str(e)
    finally:
        if ov:
            ov.close()
    ov_row = (statistics.median(vs), ov_err) if vs and not ov_why else (None, ov_why)
    return statistics.median(ks), statistics.median(os_), err, iters, ov_row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default=os.path.join(ROOT, "build", "modelset"))
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-ms", type=float, default=300)
    ap.add_argument("--only", default="")
    ap.add_argument("--csv", default="")
    default_ov = os.path.join(ROOT, ".venv-bench", "bin", "python")
    ap.add_argument("--openvino-python", default=default_ov if os.path.exists(default_ov) else "",
                    help="a Python with openvino (default .venv-bench's); '' leaves OpenVINO out")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or sorted(
        n for n in os.listdir(a.set) if os.path.exists(os.path.join(a.set, n, "outputs")))
    if not names:
        sys.exit(f"modelset: no built models in {a.set} (bench/models/make_set.py)")
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    print(f"threads={a.threads} rounds={a.rounds} budget_ms={a.budget_ms:g} cpu_count={os.cpu_count()} "
          f"onnxruntime={ort.__version__}", file=sys.stderr)
    for n in names:
        meta = load(os.path.join(a.set, n))
        for t in threads:
            row = {"model": n, "kind": meta["kind"], "family": meta["family"], "threads": t,
                   "mb": os.path.getsize(meta["model"]) / 1e6}
            try:
                k, o, err, iters, (v, ov_err) = bench_model(a, meta, t)
                best = min(o, v) if v else o
                row.update(kiln=k, ort=o, ratio=k / o, err=err, iters=iters, status="ok", ov=v,
                           ov_err=ov_err if v else None, ov_why=None if v else ov_err, best=k / best)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                row.update(status=str(e).replace("|", "/"))
            print(f"modelset: {n} threads={t}: {row.get('ratio', row['status'])}", file=sys.stderr, flush=True)
            rows.append(row)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("model,kind,family,threads,kiln_p50_ms,ort_p50_ms,ratio,max_abs_err,iterations,status,"
                    "openvino_p50_ms,ratio_best_peer\n")
            for r in rows:
                ok = r["status"] == "ok"
                ov = ok and r["ov"]
                f.write(",".join([r["model"], r["kind"], r["family"], str(r["threads"]),
                                  f"{r['kiln']:.4f}" if ok else "", f"{r['ort']:.4f}" if ok else "",
                                  f"{r['ratio']:.4f}" if ok else "", f"{r['err']:.3g}" if ok else "",
                                  str(r.get("iters", "")), "ok" if ok else "failed",
                                  f"{r['ov']:.4f}" if ov else "", f"{r['best']:.4f}" if ok else ""]) + "\n")
    report(rows, threads)


def report(rows, threads):
    cols = "| model | kind | family | MB |" + "".join(
        f" kiln {t}T ms | ORT {t}T ms | OV {t}T ms | kiln/ORT {t}T | kiln/best {t}T |" for t in threads) + \
        " max abs diff vs ORT: kiln, OV |"
    print(cols)
    print("|---|---|---|---:|" + "---:|" * (5 * len(threads)) + "---:|")
    by = {(r["model"], r["threads"]): r for r in rows}
    failed, ov_failed = {}, {}
    for n in dict.fromkeys(r["model"] for r in rows):
        first = by[(n, threads[0])]
        line = f"| {n} | {first['kind']} | {first['family']} | {first['mb']:.1f} |"
        errs, ov_errs = [], []
        for t in threads:
            r = by[(n, t)]
            if r["status"] == "ok":
                ov = f"{r['ov']:.2f}" if r["ov"] else "-"
                line += f" {r['kiln']:.2f} | {r['ort']:.2f} | {ov} | {r['ratio']:.2f} | {r['best']:.2f} |"
                errs.append(r["err"])
                if r["ov"]:
                    ov_errs.append(r["ov_err"])
                elif r["ov_why"] and not r["ov_why"].startswith("not run"):
                    ov_failed[n] = r["ov_why"]
            else:
                line += " failed | | | | |"
                failed[n] = r["status"]
        line += (f" {max(errs):.2g}" if errs else " -") + (f", {max(ov_errs):.2g} |" if ov_errs else ", - |")
        print(line)
    print()
    for kind, label in (("float", "float models"), ("int8", "INT8 models")):
        for t in threads:
            ok = [r for r in rows if r["kind"] == kind and r["threads"] == t and r["status"] == "ok"]
            if not ok:
                continue
            for key, peer in (("ratio", "onnxruntime"), ("best", "the better of onnxruntime and OpenVINO")):
                if key == "best" and not any(r["ov"] for r in ok):
                    continue
                worst = max(ok, key=lambda r: r[key])
                best = min(ok, key=lambda r: r[key])
                small = [r for r in ok if min(r["ort"], r["ov"] or r["ort"]) < 1.0]
                print(f"- {label}, {t} thread{'s' if t > 1 else ''}: median kiln / {peer} "
                      f"**{statistics.median(r[key] for r in ok):.2f}** over {len(ok)}; worst "
                      f"{worst[key]:.2f} ({worst['model']}), best {best[key]:.2f} ({best['model']}); "
                      f"{sum(r[key] <= 1.2 for r in ok)} of {len(ok)} within 1.2x"
                      + (f"; {sum(r[key] <= 1.0 for r in small)} of {len(small)} under 1 ms within 1.0x."
                         if small else "."))
    for title, which in (("Models kiln did not run:", failed),
                         ("Models OpenVINO did not run (their ratio is against onnxruntime alone):", ov_failed)):
        if which:
            print()
            print(title)
            print()
            for n, msg in which.items():
                print(f"- {n}: `{msg[:300]}`")


if __name__ == "__main__":
    main()
