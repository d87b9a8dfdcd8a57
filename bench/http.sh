#!/usr/bin/env bash
# http.sh - the HTTP front end: the digits model served by kiln versus the
# minimal libevent server (build/ceiling, which answers a fixed JSON body),
# driven by wrk with a Lua body at concurrency 1, 8 and 64, in one run:
# ROUNDS (default 1) rounds, alternating which server goes first; each row
# is the server's median round (by requests/s) with the range of its rounds.
# KILN_B=<another kiln binary> adds it to every round as "kiln_b" (a build
# before a change, say), so that both builds and the ceiling are measured
# side by side in one run.
# Writes $OUT/http.csv and $OUT/http.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 8 64"}
ROUNDS=${ROUNDS:-1}
W=$OUT/http
mkdir -p "$W"
# The digits example caches its results: this measures inference, so bypass it.
printf '%s' "${DIGITS_JSON%\}}"',"parameters":{"cache":false}}' >"$W/body.json"

kport=$(free_port); cport=$(free_port)
"$KILN" serve --model-repository model_repository --http-address 127.0.0.1 --http-port "$kport" --log-level warn >"$W/kiln.log" 2>&1 &
kpid=$!
build/ceiling "$cport" >"$W/ceiling.log" 2>&1 &
cpid=$!
bpid=""
if [ -n "${KILN_B:-}" ]; then
    bport=$(free_port)
    "$KILN_B" serve --model-repository model_repository --http-address 127.0.0.1 --http-port "$bport" --grpc-port 0 \
        --log-level warn >"$W/kiln_b.log" 2>&1 &
    bpid=$!
fi
trap 'kill $kpid $cpid $bpid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$kport" "$kpid" "$W/kiln.log"
[ -z "$bpid" ] || wait_ready "http://127.0.0.1:$bport" "$bpid" "$W/kiln_b.log"
sleep 0.3

CSV=$OUT/http.csv
ROUNDS_CSV=$W/rounds.csv
echo "round,server,concurrency,rps,p50_ms,p99_ms,errors" >"$ROUNDS_CSV"
wrk_post "http://127.0.0.1:$kport/v2/models/digits/infer" 8 "$W/body.json" /dev/null 2
one() { # ROUND SERVER PORT C
    wrk_post "http://127.0.0.1:$3/v2/models/digits/infer" "$4" "$W/body.json" "$W/$2_$4_r$1.txt"
    echo "$1,$2,$4,$(wrk_row "$W/$2_$4_r$1.txt" | tr ' ' ,)" | tee -a "$ROUNDS_CSV"
}
for r in $(seq 1 "$ROUNDS"); do
    for c in $CONCURRENCY; do
        if [ $((r % 2)) = 1 ]; then
            one "$r" ceiling "$cport" "$c"; [ -z "$bpid" ] || one "$r" kiln_b "$bport" "$c"; one "$r" kiln "$kport" "$c"
        else
            one "$r" kiln "$kport" "$c"; [ -z "$bpid" ] || one "$r" kiln_b "$bport" "$c"; one "$r" ceiling "$cport" "$c"
        fi
    done
done
"$PY" - "$ROUNDS_CSV" >"$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("server,concurrency,rps,p50_ms,p99_ms,errors,range")
keys = list(dict.fromkeys((r["concurrency"], r["server"]) for r in rows))
for c, server in sorted(keys, key=lambda k: (int(k[0]), k[1] != "ceiling")):
    rs = sorted((r for r in rows if r["server"] == server and r["concurrency"] == c), key=lambda r: float(r["rps"]))
    m = rs[(len(rs) - 1) // 2]
    rng = f"{float(rs[0]['rps']):.0f}-{float(rs[-1]['rps']):.0f}" if len(rs) > 1 else ""
    print(f"{server},{c},{m['rps']},{m['p50_ms']},{m['p99_ms']},{m['errors']},{rng}")
PY

"$PY" - "$CSV" >"$OUT/http.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
multi = any(r.get("range") for r in rows)
print("| server | concurrency | requests/s" + (" (range over rounds)" if multi else "") + " | p50 ms | p99 ms | errors |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    rng = f" ({r['range']})" if r.get("range") else ""
    print(f"| {r['server']} | {r['concurrency']} | {float(r['rps']):.0f}{rng} | {r['p50_ms']} | {r['p99_ms']} | {r['errors']} |")
by = {(r["server"], r["concurrency"]): r for r in rows}
cs = sorted({int(r["concurrency"]) for r in rows})
print()
hi, lo = str(cs[-1]), str(cs[0])
k, c = by[("kiln", hi)], by[("ceiling", hi)]
print(f"- Throughput at concurrency {hi}: kiln {float(k['rps']):.0f}/s = "
      f"{float(k['rps']) / max(float(c['rps']), 1e-9):.2f}x the ceiling ({float(c['rps']):.0f}/s); target >= 0.9x.")
k, c = by[("kiln", lo)], by[("ceiling", lo)]
print(f"- p50 at concurrency {lo}: kiln {k['p50_ms']} ms = {float(k['p50_ms']) / max(float(c['p50_ms']), 1e-9):.2f}x "
      f"the ceiling's {c['p50_ms']} ms; target <= 1.3x.")
PY
cat "$OUT/http.md"
