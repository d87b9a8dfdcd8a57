#!/usr/bin/env bash
# grpc.sh - the gRPC front end beside the HTTP one: the digits model on one
# kiln, driven by `kiln bench` with binary tensors over each protocol
# (HTTP: the binary tensor extension; gRPC: ModelInfer with
# raw_input_contents, one HTTP/2 connection per client), p50 at
# concurrency 1 and throughput at 64, in one run: ROUNDS (default 3)
# rounds, alternating which protocol goes first; each row is the
# protocol's median round (by throughput) with the range of its rounds.
# Writes $OUT/grpc.csv and $OUT/grpc.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 64"}
ROUNDS=${ROUNDS:-3}
W=$OUT/grpc
rm -rf "$W"
mkdir -p "$W"

hport=$(free_port); gport=$(free_port)
# The digits example caches its results: this measures the front ends, so the cache is off.
KILN_CACHE_SIZE=0 "$KILN" serve --model-repository model_repository --http-address 127.0.0.1 --http-port "$hport" \
    --grpc-port "$gport" --log-level warn >"$W/kiln.log" 2>&1 &
kpid=$!
trap 'kill $kpid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$hport" "$kpid" "$W/kiln.log"

one() { # ROUND PROTOCOL CONCURRENCY
    "$KILN" bench -u "127.0.0.1:$hport" --grpc-url "127.0.0.1:$gport" -i "$2" -m digits -c "$3" -d "$DURATION" \
        --warmup 1 --no-progress --csv "$W/$2_r$1.csv" >>"$W/bench.txt"
}
for r in $(seq 1 "$ROUNDS"); do
    for c in $CONCURRENCY; do alternate "$r" one http grpc "$c"; done
done

"$PY" - "$W" >"$OUT/grpc.csv" <<'PY'
import csv, glob, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_r*.csv"))):
    proto = os.path.basename(f).split("_")[0]
    for r in csv.DictReader(open(f)):
        rows.append((proto, int(r["concurrency"]), float(r["throughput"]), int(r["p50_us"]), int(r["p99_us"]),
                     int(r["errors"])))
print("protocol,concurrency,throughput,p50_ms,p99_ms,errors,range")
for c in sorted({r[1] for r in rows}):
    for proto in ("http", "grpc"):
        rs = sorted((r for r in rows if r[0] == proto and r[1] == c), key=lambda r: r[2])
        if not rs:
            continue
        m = rs[(len(rs) - 1) // 2]
        rng = f"{rs[0][2]:.0f}-{rs[-1][2]:.0f}" if len(rs) > 1 else ""
        print(f"{proto},{c},{m[2]:.1f},{m[3] / 1000:.3f},{m[4] / 1000:.3f},{sum(r[5] for r in rs)},{rng}")
PY

"$PY" - "$OUT/grpc.csv" >"$OUT/grpc.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| protocol | concurrency | infer/s (range over rounds) | p50 ms | p99 ms | errors |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    rng = f" ({r['range']})" if r["range"] else ""
    print(f"| {r['protocol']} | {r['concurrency']} | {float(r['throughput']):.0f}{rng} | {r['p50_ms']} | {r['p99_ms']} | {r['errors']} |")
by = {(r["protocol"], r["concurrency"]): r for r in rows}
cs = sorted({int(r["concurrency"]) for r in rows})
lo, hi = str(cs[0]), str(cs[-1])
g, h = by[("grpc", lo)], by[("http", lo)]
print()
print(f"- p50 at concurrency {lo}: gRPC {g['p50_ms']} ms, HTTP {h['p50_ms']} ms; target gRPC <= HTTP.")
g, h = by[("grpc", hi)], by[("http", hi)]
print(f"- Throughput at concurrency {hi}: gRPC {float(g['throughput']):.0f}/s = "
      f"{float(g['throughput']) / max(float(h['throughput']), 1e-9):.2f}x HTTP's {float(h['throughput']):.0f}/s; target >= 0.9x.")
PY
cat "$OUT/grpc.md"
