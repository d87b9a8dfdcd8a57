#!/usr/bin/env bash
# batching.sh - dynamic batching benchmark on the CPU.
#
# Serves the digits model and ResNet-50 in four modes each (batching off, on,
# fixed delay, latency budget; see bench/make_batching_repo.py) from one kiln
# server on loopback, drives each with wrk (binary-extension infer bodies,
# keep-alive connections = concurrency) and writes one table:
#   $OUT/batching.csv and $OUT/batching.md (OUT defaults to build/bench).
# Columns: model, mode, concurrency, requests/s, p50 ms, p99 ms, errors, and
# the mean batch size the server reports for that run.
#
# Environment: DURATION (s per run, default 10), CONCURRENCY ("1 16 64"),
# MODELS ("digits resnet50"), KILN (build/kiln), PORT (free port if unset),
# THREADS (wrk threads, default 2), INSTANCES (instance_group count, 1).
set -euo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-build/kiln}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-build/bench}
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-"1 16 64"}
MODELS=${MODELS:-"digits resnet50"}
THREADS=${THREADS:-2}
INSTANCES=${INSTANCES:-1}
WORK=$OUT/batching
mkdir -p "$WORK"

command -v wrk >/dev/null || { echo "batching.sh: wrk not found (apt-get install wrk)" >&2; exit 1; }
[ -x "$KILN" ] || { echo "batching.sh: $KILN not built (make)" >&2; exit 1; }

extra=()
case " $MODELS " in *" resnet50 "*) ;; *) extra+=(--no-resnet) ;; esac
"$PY" bench/make_batching_repo.py --out "$WORK" --instances "$INSTANCES" "${extra[@]}" >/dev/null

PORT=${PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
URL=http://127.0.0.1:$PORT
"$KILN" serve --model-repository "$WORK/repo" --http-address 127.0.0.1 --http-port "$PORT" \
    --log-level warn >"$WORK/server.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 600); do
    curl -sf "$URL/v2/health/ready" >/dev/null 2>&1 && break
    kill -0 "$SERVER" 2>/dev/null || { echo "batching.sh: server exited:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.1
done
curl -sf "$URL/v2/health/ready" >/dev/null || { echo "batching.sh: server not ready" >&2; exit 1; }

cat >"$WORK/post.lua" <<'EOF'
-- Posts the same binary-extension infer body on every request.
local f = assert(io.open(os.getenv("KILN_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("KILN_HLEN")
EOF

# "1.23ms" / "850.00us" / "1.05s" -> milliseconds
to_ms() {
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

# execution_count and inference_count of a model from its stats
stats() {
    curl -sf "$URL/v2/models/$1/stats" | "$PY" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]
print(s.get("inference_count", 0), s.get("execution_count", 0))'
}

CSV=$OUT/batching.csv
echo "model,mode,concurrency,rps,p50_ms,p99_ms,errors,mean_batch" >"$CSV"

run() { # model mode concurrency
    local model=$1 mode=$2 c=$3 name=$1_$2 t
    t=$(( c < THREADS ? c : THREADS ))
    read -r inf0 exe0 < <(stats "$name")
    KILN_BODY="$WORK/$model.body" KILN_HLEN=$(cat "$WORK/$model.hlen") \
        wrk -t"$t" -c"$c" -d"${DURATION}s" --timeout 30s --latency -s "$WORK/post.lua" \
        "$URL/v2/models/$name/infer" >"$WORK/wrk_${name}_$c.txt" 2>&1 || true
    read -r inf1 exe1 < <(stats "$name")
    local f=$WORK/wrk_${name}_$c.txt
    local rps p50 p99 errs mean
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$f")
    p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$f")")
    p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$f")")
    errs=$(awk '/Non-2xx or 3xx responses:/ { n += $NF } /Socket errors:/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$f")
    mean=$(awk -v i=$((inf1 - inf0)) -v e=$((exe1 - exe0)) 'BEGIN { printf "%.2f", e ? i / e : 0 }')
    echo "$model,$mode,$c,${rps:-0},$p50,$p99,$errs,$mean" | tee -a "$CSV"
}

for model in $MODELS; do
    # One short warm-up per mode: plans for the batch shapes, profile for the budget.
    for mode in off on delay budget; do
        KILN_BODY="$WORK/$model.body" KILN_HLEN=$(cat "$WORK/$model.hlen") \
            wrk -t2 -c16 -d2s --timeout 30s -s "$WORK/post.lua" "$URL/v2/models/${model}_$mode/infer" >/dev/null 2>&1 || true
    done
    for c in $CONCURRENCY; do
        run "$model" off "$c"
        run "$model" on "$c"
    done
    top=${CONCURRENCY##* }
    run "$model" delay "$top"
    run "$model" budget "$top"
done

"$PY" - "$CSV" "$WORK" >"$OUT/batching.md" <<'EOF'
import csv, sys, os
rows = list(csv.DictReader(open(sys.argv[1])))
work = sys.argv[2]
print("| model | mode | concurrency | requests/s | p50 ms | p99 ms | errors | mean batch |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {r['mode']} | {r['concurrency']} | {float(r['rps']):.1f} | {r['p50_ms']} | "
          f"{r['p99_ms']} | {r['errors']} | {r['mean_batch']} |")
print()
by = {(r["model"], r["mode"], r["concurrency"]): r for r in rows}
for model in sorted({r["model"] for r in rows}):
    cs = sorted({int(r["concurrency"]) for r in rows if r["model"] == model})
    top = str(cs[-1])
    off, on = by.get((model, "off", top)), by.get((model, "on", top))
    if off and on and float(off["rps"]) > 0:
        print(f"- {model} at concurrency {top}: batching on = {float(on['rps']) / float(off['rps']):.2f}x "
              f"the throughput of batching off; p99 {on['p99_ms']} vs {off['p99_ms']} ms.")
    d, b = by.get((model, "delay", top)), by.get((model, "budget", top))
    budget = open(os.path.join(work, f"{model}.budget")).read().strip()
    if d and b:
        print(f"- {model}: latency budget {int(budget) / 1000:g} ms: p99 {b['p99_ms']} ms at {float(b['rps']):.1f} req/s; "
              f"fixed delay {int(budget) / 2000:g} ms: p99 {d['p99_ms']} ms at {float(d['rps']):.1f} req/s.")
EOF
cat "$OUT/batching.md"
