#!/usr/bin/env bash
# ensemble.sh - an ensemble of three small ONNX models against one model that
# computes the same (the three graphs merged), side by side on one server,
# driven by `kiln bench` over HTTP, closed loop, in alternating rounds:
#   ensemble  pipe: s1 -> s2 -> s3, each step through its own model's batcher
#   merged    one graph: the three in a row, one batcher pass
# Each step is x[N,256] -> relu(x W + b) (s3 without the relu); every model
# batches (max_batch_size 64, dynamic batching without a delay). At
# concurrency 1 the difference in p50 over the ensemble's two extra steps is
# the per-step overhead: one more pass through a batcher and an instance.
# The server's cache is off. Writes $OUT/ensemble.csv (median of the rounds)
# and $OUT/ensemble.md.
#
# Environment: DURATION (s per level and round, default 10), ROUNDS (3),
# CONCURRENCY ("1 64"), KILN (build/kiln), OUT (build/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 64"}
ROUNDS=${ROUNDS:-3}
bench_dir ensemble
mkdir -p "$W/repo"

"$PY" - "$W/repo" <<'PY'
import json, os, sys
import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto as TP
root = sys.argv[1]
rng = np.random.default_rng(0)
D = 256
ws = [(rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(3)]
bs = [rng.standard_normal(D).astype(np.float32) * 0.1 for _ in range(3)]
batched = {"max_batch_size": 64, "dynamic_batching": {}}

def layer(i, x, y):
    nodes = [oh.make_node("MatMul", [x, f"W{i}"], [f"m{i}"]),
             oh.make_node("Add", [f"m{i}", f"B{i}"], [y if i == 2 else f"a{i}"])]
    if i < 2:
        nodes.append(oh.make_node("Relu", [f"a{i}"], [y]))
    inits = [oh.make_tensor(f"W{i}", TP.FLOAT, [D, D], ws[i].flatten()), oh.make_tensor(f"B{i}", TP.FLOAT, [D], bs[i])]
    return nodes, inits

def save(name, nodes, inits, x="x", y="y"):
    g = oh.make_graph(nodes, name, [oh.make_tensor_value_info(x, TP.FLOAT, ["N", D])],
                      [oh.make_tensor_value_info(y, TP.FLOAT, ["N", D])], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    os.makedirs(f"{root}/{name}/1", exist_ok=True)
    onnx.save(m, f"{root}/{name}/1/model.onnx")
    open(f"{root}/{name}/config.json", "w").write(json.dumps(batched))

for i in range(3):
    save(f"s{i + 1}", *layer(i, "x", "y"))
nodes, inits = [], []
for i in range(3):
    n, t = layer(i, "x" if i == 0 else f"h{i}", "y" if i == 2 else f"h{i + 1}")
    nodes += n
    inits += t
save("merged", nodes, inits)
io = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [D]}
step = lambda m, a, b: {"model_name": m, "model_version": -1, "input_map": {"x": a}, "output_map": {"y": b}}
os.makedirs(f"{root}/pipe/1", exist_ok=True)
open(f"{root}/pipe/config.json", "w").write(json.dumps({
    "platform": "ensemble", "max_batch_size": 64, "input": [io("x")], "output": [io("y")],
    "ensemble_scheduling": {"step": [step("s1", "x", "h1"), step("s2", "h1", "h2"), step("s3", "h2", "y")]}}))
PY

port=$(free_port)
"$KILN" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "$port" --cache-size 0 \
    >"$W/kiln.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$port" "$pid" "$W/kiln.log"

# The two answer alike (the check the comparison rests on).
"$PY" - "127.0.0.1:$port" <<'PY'
import sys
import numpy as np
import tritonclient.http as httpclient
c = httpclient.InferenceServerClient(sys.argv[1])
x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
out = []
for m in ("pipe", "merged"):
    i = httpclient.InferInput("x", [3, 256], "FP32")
    i.set_data_from_numpy(x)
    out.append(c.infer(m, [i]).as_numpy("y"))
assert np.allclose(out[0], out[1], rtol=1e-4, atol=1e-5), "ensemble and merged model disagree"
PY

RAW=$W/rounds.csv
echo "round,mode,concurrency,throughput,p50_us,p99_us,errors,server_us,cpu_us_per_req" >"$RAW"
# The server's CPU time (user + system, clock ticks) and a model's requests
# so far (its statistics, warm-up included): CPU per request is what the
# other tenants of a shared machine disturb least.
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
count() { curl -sf "http://127.0.0.1:$port/v2/models/$1/stats" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'; }
one() { # ROUND MODE CONCURRENCY
    local f=$W/$2_c$3_r$1 model=pipe t0 n0 cpu
    [ "$2" = merged ] && model=merged
    t0=$(ticks); n0=$(count "$model")
    "$KILN" bench -u "127.0.0.1:$port" -m "$model" -c "$3" -d "$DURATION" --no-progress --seed "$1" \
        --csv "$f.csv" >"$f.txt" 2>&1 || { cat "$f.txt" >&2; return 1; }
    cpu=$(awk -v t="$(( $(ticks) - t0 ))" -v n="$(( $(count "$model") - n0 ))" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.1f", n ? t * 1e6 / hz / n : 0 }')
    tail -n 1 "$f.csv" | awk -F, -v r="$1" -v m="$2" -v c="$3" -v cpu="$cpu" 'BEGIN { OFS = "," } { print r, m, c, $9, $10, $13, $7, $16 + $17, cpu }' |
        tee -a "$RAW"
}
for c in $CONCURRENCY; do
    for r in $(seq 1 "$ROUNDS"); do alternate "$r" one ensemble merged "$c"; done
done
# Batches formed at each step under load (the steps' statistics).
curl -sf "http://127.0.0.1:$port/v2/models/stats" >"$W/stats.json"

"$PY" - "$RAW" "$OUT/ensemble.csv" "$DURATION" "$ROUNDS" "$W/stats.json" >"$OUT/ensemble.md" <<'PY'
import csv, json, statistics, sys
raw, out, duration, rounds, stats = sys.argv[1:]
rows = list(csv.DictReader(open(raw)))
med = {}
for (m, c) in sorted({(r["mode"], int(r["concurrency"])) for r in rows}, key=lambda k: (k[1], k[0])):
    rs = [r for r in rows if r["mode"] == m and int(r["concurrency"]) == c]
    med[(m, c)] = {k: statistics.median(float(r[k]) for r in rs)
                   for k in ("throughput", "p50_us", "p99_us", "server_us", "cpu_us_per_req")}
    med[(m, c)]["errors"] = sum(int(r["errors"]) for r in rs)
with open(out, "w") as f:
    f.write("mode,concurrency,throughput,p50_us,p99_us,errors,server_us,cpu_us_per_req\n")
    for (m, c), v in med.items():
        f.write(f"{m},{c},{v['throughput']:.1f},{v['p50_us']:.0f},{v['p99_us']:.0f},{v['errors']},{v['server_us']:.1f},"
                f"{v['cpu_us_per_req']:.1f}\n")
print("Three small ONNX models (each x[N,256] -> relu(x W + b), the last without relu) as an ensemble of three steps "
      "(`ensemble`), against one ONNX model of the three graphs merged (`merged`), on one server, over HTTP with "
      f"`kiln bench`, closed loop, batch 1 per request; median of {rounds} alternating rounds of {duration} s. Every "
      "model batches (max_batch_size 64, dynamic batching, no delay); the cache is off.")
print()
print("| concurrency | ensemble req/s | merged req/s | ensemble / merged | ensemble p50 ms | merged p50 ms | "
      "ensemble p99 ms | merged p99 ms | p99 ensemble / merged | server CPU us/req, ensemble / merged | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
levels = sorted({c for _, c in med})
for c in levels:
    e, m = med[("ensemble", c)], med[("merged", c)]
    print(f"| {c} | {e['throughput']:.0f} | {m['throughput']:.0f} | {e['throughput'] / m['throughput']:.2f}x | "
          f"{e['p50_us'] / 1000:.3f} | {m['p50_us'] / 1000:.3f} | {e['p99_us'] / 1000:.3f} | {m['p99_us'] / 1000:.3f} | "
          f"{e['p99_us'] / m['p99_us']:.2f}x | {e['cpu_us_per_req']:.1f} / {m['cpu_us_per_req']:.1f} | "
          f"{e['errors'] + m['errors']} |")
print()
st = {s["name"]: s for s in json.load(open(stats))["model_stats"]}
parts = []
for n in ("s1", "s2", "s3", "merged"):
    s = st.get(n, {})
    inf, ex = int(s.get("inference_count", 0)), int(s.get("execution_count", 0))
    parts.append(f"{n} {inf} inferences in {ex} executions ({inf / ex if ex else 0:.1f} rows per batch)")
print("- Batches over the whole run: " + "; ".join(parts) + ".")
lo = levels[0]
e_us, m_us = med[("ensemble", lo)]["server_us"], med[("merged", lo)]["server_us"]
per_step = (e_us - m_us) / 2
print(f"- Per-step overhead at concurrency {lo}, from the server's own statistics (queue + compute, the mean per "
      f"request that `kiln bench` reads): ensemble {e_us:.1f} us, merged {m_us:.1f} us; (ensemble - merged) / 2 extra "
      f"steps = **{per_step:.1f} us per step** (a pass through a step model's batcher and instance, the tensor handed "
      "over in place).")
hi = levels[-1]
tr = med[("ensemble", hi)]["throughput"] / med[("merged", hi)]["throughput"]
p99 = med[("ensemble", hi)]["p99_us"] / med[("merged", hi)]["p99_us"]
cr = med[("ensemble", hi)]["cpu_us_per_req"] / med[("merged", hi)]["cpu_us_per_req"]
print(f"- Server CPU per request at concurrency {hi} (user + system time of the kiln process over the requests its "
      f"statistics counted, warm-up included): ensemble / merged = **{cr:.2f}x**: what the steps cost the server, "
      "least disturbed by the other work on the machine.")
print(f"- Target at concurrency {hi}: throughput >= 0.9x the merged model's ({tr:.2f}x, "
      f"**{'met' if tr >= 0.9 else 'NOT met'}**), p99 <= 1.2x ({p99:.2f}x, **{'met' if p99 <= 1.2 else 'NOT met'}**).")
PY
cat "$OUT/ensemble.md"
