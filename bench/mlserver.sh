#!/usr/bin/env bash
# mlserver.sh - kiln versus MLServer on the digits model, in one run.
#
# MLServer (bench/mlserver/: a custom runtime calling onnxruntime, adaptive
# batching on with max_batch_size 64 and max_batch_time 0.5 ms) is the
# Python KServe v2 server a team would otherwise deploy. Both servers are driven by `kiln bench` with JSON
# tensors (MLServer has no binary extension) at concurrency 1, 8 and 64, kiln
# with its result cache off (MLServer has none: both compute every request),
# alternating server per level so machine noise hits both alike. kiln with
# the binary extension is measured too, for reference.
# Writes $OUT/mlserver.csv and $OUT/mlserver.md.
#
# Environment: DURATION (s per level, default 10), CONCURRENCY ("1 8 64"),
# KILN (build/kiln), MLSERVER (.venv-bench/bin/mlserver), OUT (build/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 8 64"}
MLSERVER=${MLSERVER:-.venv-bench/bin/mlserver}
BENCH_PY=${BENCH_PY:-.venv-bench/bin/python}
W=$OUT/mlserver
rm -rf "$W"
mkdir -p "$W/repo/digits"
W=$(cd "$W" && pwd)

[ -x "$KILN" ] || { echo "mlserver.sh: $KILN not built (make)" >&2; exit 1; }
[ -x "$MLSERVER" ] || { echo "mlserver.sh: $MLSERVER missing (bench/run.sh makes .venv-bench)" >&2; exit 1; }

mlserver_bin=$(cd "$(dirname "$MLSERVER")" && pwd)/$(basename "$MLSERVER")

# MLServer's repository: settings, the runtime, the model next to its settings.
cp bench/mlserver/settings.json bench/mlserver/runtime.py "$W/repo/"
cp bench/mlserver/digits/model-settings.json "$W/repo/digits/"
cp model_repository/digits/1/model.onnx "$W/repo/digits/model.onnx"

kport=$(free_port); mport=$(free_port); mgrpc=$(free_port); mmetrics=$(free_port)
# The result cache off: MLServer computes every request, so kiln does too.
"$KILN" serve --model-repository model_repository --http-address 127.0.0.1 --http-port "$kport" \
    --log-level warn --cache-size 0 >"$W/kiln.log" 2>&1 &
kpid=$!
# MLServer forks inference workers: its own process group, so it stops whole.
(cd "$W/repo" && MLSERVER_HTTP_PORT=$mport MLSERVER_GRPC_PORT=$mgrpc MLSERVER_METRICS_PORT=$mmetrics \
    exec setsid "$mlserver_bin" start . >"$W/mlserver.log" 2>&1) &
mpid=$!
cleanup() {
    kill "$kpid" 2>/dev/null || true
    kill -- "-$mpid" 2>/dev/null || kill "$mpid" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_ready "http://127.0.0.1:$kport" "$kpid" "$W/kiln.log"
for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$mport/v2/models/digits/ready" >/dev/null 2>&1 && break
    kill -0 "$mpid" 2>/dev/null || { echo "mlserver.sh: MLServer exited:" >&2; tail -40 "$W/mlserver.log" >&2; exit 1; }
    sleep 0.1
done
curl -sf "http://127.0.0.1:$mport/v2/models/digits/ready" >/dev/null ||
    { echo "mlserver.sh: MLServer's digits model not ready:" >&2; tail -40 "$W/mlserver.log" >&2; exit 1; }

# One request through each, checked, before timing anything.
for p in "$kport" "$mport"; do
    curl -sf -H 'Content-Type: application/json' -d "$DIGITS_JSON" "http://127.0.0.1:$p/v2/models/digits/infer" \
        >"$W/check_$p.json" || { echo "mlserver.sh: infer on port $p failed" >&2; exit 1; }
    grep -q '"label"' "$W/check_$p.json" || { echo "mlserver.sh: no label from port $p" >&2; exit 1; }
done

CSV=$OUT/mlserver.csv
rm -f "$CSV"
# bench SERVER PROTOCOL PORT C [extra kiln bench args]
bench() {
    local server=$1 proto=$2 port=$3 c=$4 tmp=$W/$1_$2_$4.csv
    shift 4
    rm -f "$tmp"
    "$KILN" bench -u "127.0.0.1:$port" -m digits -c "$c" -d "$DURATION" --warmup 1 --no-progress \
        --csv "$tmp" "$@" >"$W/${server}_${proto}_$c.txt" 2>&1 ||
        { echo "mlserver.sh: kiln bench against $server failed:" >&2; cat "$W/${server}_${proto}_$c.txt" >&2; exit 1; }
    [ -f "$CSV" ] || echo "server,protocol,$(head -1 "$tmp")" >"$CSV"
    tail -n +2 "$tmp" | sed "s/^/$server,$proto,/" | tee -a "$CSV"
}

for c in $CONCURRENCY; do
    bench kiln json "$kport" "$c" --json-data
    bench mlserver json "$mport" "$c" --json-data
    bench kiln binary "$kport" "$c"
done

# Proof that kiln computed every request: its cache hits over the whole run.
khits=$(curl -sf "http://127.0.0.1:$kport/v2/models/digits/stats" | "$PY" -c '
import json, sys
print(int(json.load(sys.stdin)["model_stats"][0]["inference_stats"].get("cache_hit", {}).get("count", 0)))')

"${BENCH_PY}" - "$CSV" "$khits" >"$OUT/mlserver.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
khits = int(sys.argv[2])
print("Driven by `kiln bench` (closed loop, one connection per outstanding request, 64 distinct "
      "random bodies). MLServer 1.7.1: custom runtime calling onnxruntime (bench/mlserver/runtime.py), "
      "adaptive batching (max_batch_size 64, max_batch_time 0.5 ms), its default of one inference "
      "worker process; kiln: model_repository/digits as shipped (dynamic batching, max_batch_size 64) "
      "with the result cache off (`--cache-size 0`): both servers run the model for every request. "
      f"Both use onnxruntime's / kiln's default thread counts. kiln's result cache hits over the run: {khits}.")
print()
print("| server | protocol | concurrency | requests/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
ms = lambda v: f"{float(v) / 1000:.3f}"
for r in rows:
    print(f"| {r['server']} | {r['protocol']} | {r['concurrency']} | {float(r['throughput']):.0f} | {ms(r['p50_us'])} | "
          f"{ms(r['p90_us'])} | {ms(r['p99_us'])} | {ms(r['p999_us'])} | {r['errors']} |")
print()
by = {(r["server"], r["protocol"], r["concurrency"]): r for r in rows}
for c in sorted({int(r["concurrency"]) for r in rows}):
    k, m = by.get(("kiln", "json", str(c))), by.get(("mlserver", "json", str(c)))
    if not (k and m):
        continue
    ratio = float(k["throughput"]) / max(float(m["throughput"]), 1e-9)
    line = (f"- Concurrency {c}, JSON both: kiln {float(k['throughput']):.0f}/s vs MLServer "
            f"{float(m['throughput']):.0f}/s = **{ratio:.1f}x**; p99 {ms(k['p99_us'])} vs {ms(m['p99_us'])} ms")
    if c == max(int(r["concurrency"]) for r in rows):
        met = ratio >= 20 and float(k["p99_us"]) < float(m["p99_us"])
        line += f". Target (>= 20x at a lower p99): **{'met' if met else 'NOT met'}**."
    else:
        line += "."
    print(line)
PY
cat "$OUT/mlserver.md"
