#!/usr/bin/env bash
# http.sh - the HTTP front end: the digits model served by kiln versus the
# minimal libevent server (build/ceiling, which answers a fixed JSON body),
# driven by wrk with a Lua body at concurrency 1, 8 and 64, in one run.
# Writes $OUT/http.csv and $OUT/http.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 8 64"}
W=$OUT/http
mkdir -p "$W"
# The digits example caches its results: this measures inference, so bypass it.
printf '%s' "${DIGITS_JSON%\}}"',"parameters":{"cache":false}}' >"$W/body.json"

kport=$(free_port); cport=$(free_port)
"$KILN" serve --model-repository model_repository --http-address 127.0.0.1 --http-port "$kport" --log-level warn >"$W/kiln.log" 2>&1 &
kpid=$!
build/ceiling "$cport" >"$W/ceiling.log" 2>&1 &
cpid=$!
trap 'kill $kpid $cpid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$kport" "$kpid" "$W/kiln.log"
sleep 0.3

CSV=$OUT/http.csv
echo "server,concurrency,rps,p50_ms,p99_ms,errors" >"$CSV"
wrk_post "http://127.0.0.1:$kport/v2/models/digits/infer" 8 "$W/body.json" /dev/null 2
for c in $CONCURRENCY; do
    wrk_post "http://127.0.0.1:$cport/v2/models/digits/infer" "$c" "$W/body.json" "$W/ceiling_$c.txt"
    echo "ceiling,$c,$(wrk_row "$W/ceiling_$c.txt" | tr ' ' ,)" | tee -a "$CSV"
    wrk_post "http://127.0.0.1:$kport/v2/models/digits/infer" "$c" "$W/body.json" "$W/kiln_$c.txt"
    echo "kiln,$c,$(wrk_row "$W/kiln_$c.txt" | tr ' ' ,)" | tee -a "$CSV"
done

"$PY" - "$CSV" >"$OUT/http.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| server | concurrency | requests/s | p50 ms | p99 ms | errors |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['server']} | {r['concurrency']} | {float(r['rps']):.0f} | {r['p50_ms']} | {r['p99_ms']} | {r['errors']} |")
by = {(r["server"], r["concurrency"]): r for r in rows}
cs = sorted({int(r["concurrency"]) for r in rows})
print()
hi, lo = str(cs[-1]), str(cs[0])
k, c = by[("kiln", hi)], by[("ceiling", hi)]
print(f"- Throughput at concurrency {hi}: kiln {float(k['rps']):.0f}/s = "
      f"{float(k['rps']) / max(float(c['rps']), 1e-9):.2f}x the ceiling ({float(c['rps']):.0f}/s); target >= 0.7x.")
k, c = by[("kiln", lo)], by[("ceiling", lo)]
print(f"- p50 at concurrency {lo}: kiln {k['p50_ms']} ms = {float(k['p50_ms']) / max(float(c['p50_ms']), 1e-9):.2f}x "
      f"the ceiling's {c['p50_ms']} ms; target <= 2x.")
PY
cat "$OUT/http.md"
