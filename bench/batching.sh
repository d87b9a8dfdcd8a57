#!/usr/bin/env bash
# batching.sh - dynamic batching benchmark on the CPU, with kiln's own load
# generator (kiln bench: binary-extension requests, 64 distinct bodies).
#
# For the digits model and ResNet-50 (bench/make_batching_repo.py makes the
# repository: one model directory per batching mode, same ONNX file):
#   1. closed loop at concurrency 1, 16, 64 with batching off and on
#      (dynamic_batching with no delay: batches form while the instance is busy);
#   2. the latency budget against a fixed delay "tuned for the same budget"
#      (half of it): closed loop at the highest concurrency for throughput, and
#      open loop (Poisson arrivals) at a quarter of batching-on's throughput
#      there, where the budget is checked against p99.
# The budget is derived from the model's measured single-request latency:
# batching off, Poisson arrivals at a sixteenth of batching-on's throughput
# at the highest concurrency (so requests rarely overlap; row "off" with that
# rate): the larger of BUDGET_FACTOR x its p50 and 1.5 x its p99 (the
# machine's noise floor), at least BUDGET_MIN_US; or BUDGET_<MODEL>_US. The
# server is restarted with it for step 2. Not the closed loop at concurrency
# 1: on a virtual machine whose cores sleep when idle, a request that finds
# the machine idle runs slower than back-to-back ones (ResNet-50 with 2
# threads: 44 vs 25 ms of compute; 27 ms in the open loop while busy-looping
# low-priority processes kept the cores awake), and the open loop is where
# the budget is checked.
# Writes $OUT/batching.csv and $OUT/batching.md (OUT defaults to build/bench).
#
# The comparisons (off vs on at the highest concurrency; fixed delay vs
# budget there and in the open loop) run in rounds, alternating the two modes
# and which goes first, and report each mode's median round with the range
# of its rounds, and the median of its paired (same-round) throughput ratios:
# two modes that form the same batches then differ by the machine's noise
# only, which the range shows.
# Environment: DURATION_DIGITS / DURATION_RESNET50 (s per level, DURATION or 5 / 20),
# DURATION_OPEN_RESNET50 (s per open-loop run, 30), ROUNDS (3; also the open-loop
# rounds), BUDGET_ROUNDS (closed-loop rounds of the budget vs the delay, 5),
# CONCURRENCY ("1 16 64"), MODELS ("digits resnet50"), KILN (build/kiln),
# INSTANCES (instance_group count, 1), BUDGET_FACTOR (4), BUDGET_MIN_US (2000).
set -euo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-build/kiln}
CEILING=${CEILING:-build/ceiling}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-build/bench}
CONCURRENCY=${CONCURRENCY:-"1 16 64"}
MODELS=${MODELS:-"digits resnet50"}
INSTANCES=${INSTANCES:-1}
ROUNDS=${ROUNDS:-3}
BUDGET_ROUNDS=${BUDGET_ROUNDS:-$(( ROUNDS > 1 ? 5 : 1 ))}
BUDGET_FACTOR=${BUDGET_FACTOR:-4}
BUDGET_MIN_US=${BUDGET_MIN_US:-2000}
WORK=$OUT/batching
mkdir -p "$WORK"
rm -f "$WORK"/run_*.csv

[ -x "$KILN" ] || { echo "batching.sh: $KILN not built (make)" >&2; exit 1; }
"$KILN" bench --help >/dev/null 2>&1 || { echo "batching.sh: $KILN has no bench command" >&2; exit 1; }

SERVER=
PORT=
stop_server() {
    if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
    SERVER=
}
trap stop_server EXIT

start_server() {
    PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$KILN" serve --model-repository "$WORK/repo" --http-address 127.0.0.1 --http-port "$PORT" \
        --log-level warn >>"$WORK/server.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER" 2>/dev/null || { echo "batching.sh: server exited:" >&2; tail "$WORK/server.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "batching.sh: server not ready" >&2
    exit 1
}

make_repo() { # extra args for make_batching_repo.py
    local extra=()
    case " $MODELS " in *" resnet50 "*) ;; *) extra+=(--no-resnet) ;; esac
    rm -rf "$WORK/repo"
    "$PY" bench/make_batching_repo.py --out "$WORK" --instances "$INSTANCES" "${extra[@]}" "$@" >/dev/null
}

# inference_count and execution_count of a model, from its stats
stats() {
    curl -sf "http://127.0.0.1:$PORT/v2/models/$1/stats" | "$PY" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]
print(s.get("inference_count", 0), s.get("execution_count", 0))'
}

# Waits until nothing of this model is queued or running (a closed-loop run
# leaves its last requests behind when it stops).
drain() {
    for _ in $(seq 1 1200); do
        local n
        n=$(curl -sf "http://127.0.0.1:$PORT/metrics" | awk -v m="model=\"$1\"" \
            '/^kiln_inference_pending_request_count\{/ && index($0, m) { print $NF }')
        [ "${n%.*}" = "0" ] && return 0
        sleep 0.1
    done
}

# duration MODEL LABEL: seconds of one run; an open-loop run (rate=...) of
# ResNet-50 is longer, for enough requests behind its p99.
duration() {
    case $1:$2 in
    digits:*) echo "${DURATION_DIGITS:-${DURATION:-5}}" ;;
    *:rate=*) echo "${DURATION_OPEN_RESNET50:-30}" ;;
    *) echo "${DURATION_RESNET50:-20}" ;;
    esac
}

# run MODEL MODE LABEL LOAD-ARGS...: one level of kiln bench, one CSV row
run() {
    local model=$1 mode=$2 label=$3
    shift 3
    local name=${model}_$mode csv=$WORK/run_${model}_${mode}_$label.csv
    drain "$name"
    read -r inf0 exe0 < <(stats "$name")
    "$KILN" bench -u "127.0.0.1:$PORT" -m "$name" "$@" -d "$(duration "$model" "$label")" --warmup 1 \
        --timeout-ms 120000 --no-progress --csv "$csv" >"$WORK/run_${model}_${mode}_$label.txt" 2>&1 || true
    drain "$name"
    read -r inf1 exe1 < <(stats "$name")
    local mean
    mean=$(awk -v i=$((inf1 - inf0)) -v e=$((exe1 - exe0)) 'BEGIN { printf "%.2f", e ? i / e : 0 }')
    if [ ! -s "$csv" ]; then
        echo "batching.sh: $name $label: kiln bench wrote nothing:" >&2
        tail -3 "$WORK/run_${model}_${mode}_$label.txt" >&2
        return 0
    fi
    tail -n 1 "$csv" | awk -F, -v model="$model" -v mode="$mode" -v label="$label" -v mean="$mean" -v b="${BUDGET[$model]:-}" \
        'BEGIN { OFS = "," } { print model, mode, label, $9, $10 / 1000, $13 / 1000, $7, mean, $16, $17, b, "", "", "" }' |
        tee -a "${RUN_CSV:-$CSV}"
}

# medians ROUNDS LABEL MODE [OTHER]: each mode's median round of the rounds
# file, to the CSV (see pair); with OTHER, the paired ratios too.
medians() {
    "$PY" - "$@" <<'PY' | tee -a "$CSV"
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
label, modes = sys.argv[2], sys.argv[3:]
key = 5 if label.startswith("rate=") else 3
by = {m: [r for r in rows if r[1] == m] for m in modes}
for mode in modes:
    mine = by[mode]
    theirs = by[modes[1] if mode == modes[0] else modes[0]] if len(modes) > 1 else []
    if not mine:
        continue
    rs = sorted(mine, key=lambda r: float(r[key]))
    med = list(rs[(len(rs) - 1) // 2])
    lo, hi = float(rs[0][key]), float(rs[-1][key])
    med[11] = f"{lo:.1f}-{hi:.1f}" if len(rs) > 1 and key == 3 else ""
    med[12] = f"{lo:.2f}-{hi:.2f}" if len(rs) > 1 and key == 5 else ""
    ratios = [float(x[3]) / float(y[3]) for x, y in zip(mine, theirs) if float(y[3]) > 0]
    med[13] = f"{statistics.median(ratios):.3f}" if len(ratios) > 1 and key == 3 else ""
    print(",".join(med))
PY
}

# pair MODEL MODE_A MODE_B LABEL LOAD-ARGS...: ROUNDS alternating rounds of
# both modes at one load (which mode goes first alternates too). Each mode's
# median round goes to the CSV with the range of its rounds: by throughput in
# a closed loop, by p99 in an open loop (where throughput is the offered
# rate). "paired" is the median over rounds of this mode's throughput over
# the other's in the same round: the two runs of a round are adjacent in
# time, so a slow spell of the machine that spans a round cancels out.
pair() {
    local model=$1 a=$2 b=$3 label=$4 r
    shift 4
    local rounds=$WORK/rounds_${model}_${a}_${b}_$label.csv
    : >"$rounds"
    for r in $(seq 1 "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then
            RUN_CSV=$rounds run "$model" "$a" "$label" "$@" >/dev/null
            RUN_CSV=$rounds run "$model" "$b" "$label" "$@" >/dev/null
        else
            RUN_CSV=$rounds run "$model" "$b" "$label" "$@" >/dev/null
            RUN_CSV=$rounds run "$model" "$a" "$label" "$@" >/dev/null
        fi
    done
    medians "$rounds" "$label" "$a" "$b"
}

# ceiling_bound C: the most any batching policy could give the digits model
# on this machine. build/ceiling runs no model (it reads each request and
# answers a fixed body) and meets the same load generator at concurrency C
# for ROUNDS runs; the median run goes to the CSV as mode "ceiling". Its
# throughput over batching off's bounds batching on's.
ceiling_bound() {
    local c=$1 port pid r rounds=$WORK/rounds_ceiling.csv
    [ -x "$CEILING" ] || return 0
    port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$CEILING" "$port" >>"$WORK/ceiling.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/v2/models/digits" >/dev/null 2>&1 && break; sleep 0.1; done
    : >"$rounds"
    for r in $(seq 1 "$ROUNDS"); do
        rm -f "$WORK/run_ceiling.csv"
        "$KILN" bench -u "127.0.0.1:$port" -m digits -c "$c" -d "$(duration digits "c=$c")" --warmup 1 \
            --no-progress --csv "$WORK/run_ceiling.csv" >/dev/null 2>&1 || true
        [ -s "$WORK/run_ceiling.csv" ] && tail -n 1 "$WORK/run_ceiling.csv" | awk -F, -v label="c=$c" \
            'BEGIN { OFS = "," } { print "digits", "ceiling", label, $9, $10 / 1000, $13 / 1000, $7, "", "", "", "", "", "", "" }' >>"$rounds"
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    medians "$rounds" "c=$c" ceiling
}

CSV=$OUT/batching.csv
echo "model,mode,load,throughput,p50_ms,p99_ms,errors,mean_batch,server_queue_us,server_compute_us,budget_us,range,p99_range,paired" >"$CSV"
declare -A BUDGET

make_repo
start_server
for model in $MODELS; do
    # Warm-up: plans for the batch sizes the runs will see.
    for mode in off on; do
        "$KILN" bench -u "127.0.0.1:$PORT" -m "${model}_$mode" -c 16 -d 2 --warmup 0 --no-progress >/dev/null 2>&1 || true
        drain "${model}_$mode"
    done
    for c in $CONCURRENCY; do
        if [ "$c" = "${CONCURRENCY##* }" ] && [ "$ROUNDS" -gt 1 ]; then
            pair "$model" off on "c=$c" -c "$c"
        else
            run "$model" off "c=$c" -c "$c"
            run "$model" on "c=$c" -c "$c"
        fi
    done
    [ "$model" = digits ] && ceiling_bound "${CONCURRENCY##* }"
    thr=$(awk -F, -v m="$model" -v c="c=${CONCURRENCY##* }" '$1 == m && $2 == "on" && $3 == c { print $4 }' "$CSV")
    arate=$(awk -v t="${thr:-16}" 'BEGIN { r = t / 16; if (r < 1) r = 1; printf "%d", r }')
    run "$model" off "rate=$arate" -r "$arate" --poisson
done
stop_server

# The budget from the measured single-request latency, then the budget runs.
budget_args=()
for model in $MODELS; do
    var=BUDGET_$(echo "$model" | tr a-z A-Z)_US
    if [ -n "${!var:-}" ]; then
        b=${!var}
    else
        read -r p50 p99 < <(awk -F, -v m="$model" '$1 == m && $2 == "off" && $3 ~ /^rate=/ { print $5, $6 }' "$CSV")
        b=$(awk -v p="${p50:-1}" -v q="${p99:-1}" -v f="$BUDGET_FACTOR" -v lo="$BUDGET_MIN_US" \
            'BEGIN { b = p * 1000 * f; if (q * 1500 > b) b = q * 1500; if (b < lo) b = lo; printf "%d", b }')
    fi
    BUDGET[$model]=$b
    budget_args+=("--budget-$model" "$b")
done
make_repo "${budget_args[@]}"
start_server
top=${CONCURRENCY##* }
for model in $MODELS; do
    for mode in delay budget; do
        "$KILN" bench -u "127.0.0.1:$PORT" -m "${model}_$mode" -c 16 -d 2 --warmup 0 --no-progress >/dev/null 2>&1 || true
        drain "${model}_$mode"
    done
    thr=$(awk -F, -v m="$model" -v c="c=$top" '$1 == m && $2 == "on" && $3 == c { print $4 }' "$CSV")
    rate=$(awk -v t="${thr:-10}" 'BEGIN { r = t / 4; if (r < 1) r = 1; printf "%d", r }')
    if [ "$BUDGET_ROUNDS" -gt 1 ]; then
        ROUNDS=$BUDGET_ROUNDS pair "$model" delay budget "c=$top" -c "$top"
        pair "$model" delay budget "rate=$rate" -r "$rate" --poisson
    else
        run "$model" delay "c=$top" -c "$top"
        run "$model" budget "c=$top" -c "$top"
        run "$model" delay "rate=$rate" -r "$rate" --poisson
        run "$model" budget "rate=$rate" -r "$rate" --poisson
    fi
done
stop_server

"$PY" - "$CSV" >"$OUT/batching.md" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def mode(r):
    b = int(r["budget_us"] or 0)
    return {"off": "off", "on": "on (no delay)", "ceiling": "no model: bench/ceiling.c (bound)", "delay": f"fixed delay {b / 2000:g} ms",
            "budget": f"latency budget {b / 1000:g} ms"}[r["mode"]]
print("| model | batching | load | infer/s (range over rounds) | paired ratio | p50 ms | p99 ms (range) | errors | mean batch | server queue / compute us |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    rng = f" ({r['range']})" if r.get("range") else ""
    prng = f" ({r['p99_range']})" if r.get("p99_range") else ""
    print(f"| {r['model']} | {mode(r)} | {r['load']} | {float(r['throughput']):.1f}{rng} | {r.get('paired') or ''} | "
          f"{float(r['p50_ms']):.2f} | {float(r['p99_ms']):.2f}{prng} | {r['errors']} | {r['mean_batch'] or '-'} | "
          + (f"{float(r['server_queue_us']):.0f} / {float(r['server_compute_us']):.0f} |" if r["server_queue_us"] else "- |"))
print()
by = {(r["model"], r["mode"], r["load"]): r for r in rows}
for model in dict.fromkeys(r["model"] for r in rows):
    loads = [r["load"] for r in rows if r["model"] == model and r["mode"] == "off" and r["load"].startswith("c=")]
    if loads:
        top = loads[-1]
        off, on = by.get((model, "off", top)), by.get((model, "on", top))
        if off and on and float(off["throughput"]) > 0:
            print(f"- {model}, {top}: batching on gives {float(on['throughput']) / float(off['throughput']):.2f}x "
                  f"the throughput of batching off; p99 {float(on['p99_ms']):.1f} vs {float(off['p99_ms']):.1f} ms.")
            ceil = by.get((model, "ceiling", top))
            if ceil:
                print(f"- {model}, {top}: a server that runs no model at all (bench/ceiling.c) reaches "
                      f"{float(ceil['throughput']) / float(off['throughput']):.2f}x batching off's throughput under "
                      f"the same load generator: no batching policy can give more than that on this machine.")
    alone = [r for r in rows if r["model"] == model and r["mode"] == "off" and r["load"].startswith("rate=")]
    bud = [r for r in rows if r["model"] == model and r["mode"] == "budget"]
    if alone and bud:
        a = alone[-1]
        print(f"- {model}: the budget, {int(bud[0]['budget_us']) / 1000:g} ms, is the larger of 4 x p50 and 1.5 x p99 "
              f"of batching off alone ({a['load']}/s Poisson: p50 {float(a['p50_ms']):.2f} ms, p99 "
              f"{float(a['p99_ms']):.2f} ms), at least 2 ms; the fixed delay is half of it.")
    for r in rows:
        if r["model"] == model and r["mode"] == "budget" and r["load"].startswith("rate="):
            d = by.get((model, "delay", r["load"]))
            b = int(r["budget_us"]) / 1000
            verdict = "meets" if float(r["p99_ms"]) <= b else "misses"
            line = f"- {model}, {r['load']}/s open loop: the {b:g} ms budget {verdict} its budget at p99 ({float(r['p99_ms']):.2f} ms)"
            if d:
                line += f"; the fixed {b / 2:g} ms delay: p99 {float(d['p99_ms']):.2f} ms"
            print(line + ".")
        if r["model"] == model and r["mode"] == "budget" and r["load"].startswith("c="):
            d = by.get((model, "delay", r["load"]))
            if d:
                pr = f" (paired ratio over rounds {r['paired']})" if r.get("paired") else ""
                print(f"- {model}, {r['load']}: latency budget {float(r['throughput']):.1f} infer/s vs fixed delay "
                      f"{float(d['throughput']):.1f} infer/s{pr}.")
EOF
cat "$OUT/batching.md"
