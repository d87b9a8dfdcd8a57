#!/usr/bin/env bash
# cache.sh - the result cache path, side by side in one run:
#   ceiling       build/ceiling (fixed JSON answer, no parsing, no inference)
#   tier-1 hits   kiln --cache-size 256M, the same request body every time
#   Redis hits    kiln --cache-size 0 --redis-url (a redis-server of its own)
#   all misses    kiln --cache-size 256M, every request distinct (--unique)
#   disabled      the same distinct load on a model with response_cache off
# All driven by `kiln bench` (binary extension, closed loop), alternating per
# concurrency level so machine noise hits every configuration alike. The
# server's own cache_hit / cache_miss counts are read around every run: they
# prove hits are hits and misses are misses, and tell whether the server has
# a working cache at all (if not, the report says so instead of numbers).
# Writes $OUT/cache.csv and $OUT/cache.md.
#
# Environment: DURATION (s per level and round, default 10), ROUNDS (3),
# CONCURRENCY ("1 64"),
# KILN (build/kiln), CEILING (build/ceiling), OUT (build/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 64"}
ROUNDS=${ROUNDS:-3}
CEILING=${CEILING:-build/ceiling}
W=$OUT/cache
rm -rf "$W"
mkdir -p "$W/repo"
W=$(cd "$W" && pwd)

for b in "$KILN" "$CEILING"; do
    [ -x "$b" ] || { echo "cache.sh: $b not built (make $b)" >&2; exit 1; }
done
command -v redis-server >/dev/null || { echo "cache.sh: redis-server not found (apt-get install redis-server)" >&2; exit 1; }

# Two copies of the digits model: one with the response cache on, one off.
for m in digits_cache digits_nocache; do
    mkdir -p "$W/repo/$m/1"
    cp model_repository/digits/1/model.onnx "$W/repo/$m/1/"
    enable=$([ $m = digits_cache ] && echo true || echo false)
    "$PY" - "$m" "$enable" model_repository/digits/config.json "$W/repo/$m/config.json" <<'PY'
import json, sys
name, enable, src, dst = sys.argv[1:]
c = json.load(open(src))
c["name"] = name
c["response_cache"] = {"enable": enable == "true"}
json.dump(c, open(dst, "w"), indent=1)
PY
done

t1port=$(free_port); rport=$(free_port); rdport=$(free_port); cport=$(free_port)
redis-server --port "$rdport" --bind 127.0.0.1 --save "" --appendonly no --dir "$W" >"$W/redis.log" 2>&1 &
rdpid=$!
"$KILN" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "$t1port" --log-level warn \
    --cache-size 256M >"$W/kiln_tier1.log" 2>&1 &
t1pid=$!
"$CEILING" "$cport" >"$W/ceiling.log" 2>&1 &
cpid=$!
pids="$t1pid $cpid $rdpid"
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 100); do
    redis-cli -p "$rdport" ping >/dev/null 2>&1 && break
    sleep 0.1
done
redis-cli -p "$rdport" ping >/dev/null || { echo "cache.sh: redis-server did not start:" >&2; cat "$W/redis.log" >&2; exit 1; }
"$KILN" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "$rport" --log-level warn \
    --cache-size 0 --redis-url "redis://127.0.0.1:$rdport/0" >"$W/kiln_redis.log" 2>&1 &
rpid=$!
pids="$rpid $pids"
wait_ready "http://127.0.0.1:$t1port" "$t1pid" "$W/kiln_tier1.log"
wait_ready "http://127.0.0.1:$rport" "$rpid" "$W/kiln_redis.log"

# cache_counts PORT MODEL -> "hits misses" from the v2 statistics
cache_counts() {
    curl -sf "http://127.0.0.1:$1/v2/models/$2/stats" | "$PY" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]["inference_stats"]
print(int(s.get("cache_hit", {}).get("count", 0)), int(s.get("cache_miss", {}).get("count", 0)))'
}

RAW=$OUT/cache_rounds.csv
CSV=$OUT/cache.csv
rm -f "$RAW" "$CSV"
# run ROUND CONFIG PORT MODEL C [kiln bench args]: one level, then the server's hit/miss deltas.
run() {
    local round=$1 cfg=$2 port=$3 model=$4 c=$5 tmp=$W/$2_$5_r$1.csv h0=0 m0=0 h1=0 m1=0
    shift 5
    rm -f "$tmp"
    [ "$cfg" = ceiling ] || read -r h0 m0 < <(cache_counts "$port" "$model")
    "$KILN" bench -u "127.0.0.1:$port" -m "$model" -c "$c" -d "$DURATION" --warmup 1 --no-progress \
        --csv "$tmp" "$@" >"$W/${cfg}_${c}_r$round.txt" 2>&1 ||
        { echo "cache.sh: kiln bench ($cfg) failed:" >&2; cat "$W/${cfg}_${c}_r$round.txt" >&2; exit 1; }
    [ "$cfg" = ceiling ] || read -r h1 m1 < <(cache_counts "$port" "$model")
    [ -f "$RAW" ] || echo "round,config,cache_hits,cache_misses,$(head -1 "$tmp")" >"$RAW"
    tail -n +2 "$tmp" | sed "s/^/$round,$cfg,$((h1 - h0)),$((m1 - m0)),/" | tee -a "$RAW"
}

# Distinct bodies for the miss runs: more than a level can send. The fastest
# run of this round and level so far (the ceiling or a hit run) bounds the
# rate of a miss run, within the machine's noise: twice that rate over the
# run and its warm-up. A body sent twice would be a hit; the server's counts
# in the table show whether any happened.
unique_for() { # ROUND C
    awk -F, -v r="$1" -v c="$2" '$1 == r && $7 == c && $13 > top { top = $13 }
        END { n = top * ('"$DURATION"' + 1) * 2 + 2000; printf "%d", (n > 20000 ? n : 20000) }' "$RAW"
}

# ROUNDS interleaved rounds (every configuration once per round, per level):
# on a shared machine, noise then falls on all configurations alike, and the
# report takes each configuration's median round.
for round in $(seq 1 "$ROUNDS"); do
    for c in $CONCURRENCY; do
        run "$round" ceiling "$cport" digits "$c" --unique 1
        run "$round" tier1_hits "$t1port" digits_cache "$c" --unique 1
        run "$round" redis_hits "$rport" digits_cache "$c" --unique 1
        u=$(unique_for "$round" "$c")
        # Fresh seeds per round and level: no run may find an earlier one's entries.
        # The pair compared for the miss cost swaps order every round.
        if [ $((round % 2)) = 1 ]; then
            run "$round" all_misses "$t1port" digits_cache "$c" --unique "$u" --seed $((1000 * round + c))
            run "$round" disabled "$t1port" digits_nocache "$c" --unique "$u" --seed $((1000 * round + c))
        else
            run "$round" disabled "$t1port" digits_nocache "$c" --unique "$u" --seed $((1000 * round + c))
            run "$round" all_misses "$t1port" digits_cache "$c" --unique "$u" --seed $((1000 * round + c))
        fi
    done
done

# cache.csv: per configuration and level, the round with the median
# throughput (its latencies with it); hits and misses summed over rounds.
"$PY" - "$RAW" "$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
groups = {}
for r in rows:
    groups.setdefault((r["config"], r["concurrency"]), []).append(r)
fields = [f for f in rows[0].keys() if f != "round"] + ["rounds", "throughput_min", "throughput_max"]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for key, g in groups.items():
        g = sorted(g, key=lambda r: float(r["throughput"]))
        med = dict(g[(len(g) - 1) // 2])
        del med["round"]
        med["cache_hits"] = sum(int(r["cache_hits"]) for r in g)
        med["cache_misses"] = sum(int(r["cache_misses"]) for r in g)
        med["rounds"] = len(g)
        med["throughput_min"] = g[0]["throughput"]
        med["throughput_max"] = g[-1]["throughput"]
        w.writerow(med)
PY

"$PY" - "$CSV" >"$OUT/cache.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {(r["config"], r["concurrency"]): r for r in rows}
names = {"ceiling": "ceiling (fixed answer)", "tier1_hits": "tier-1 hits (in process)",
         "redis_hits": "Redis hits (--cache-size 0)", "all_misses": "all misses (cache on)",
         "disabled": "cache disabled (same load)"}
hits = sum(int(r["cache_hits"]) for r in rows if r["config"] in ("tier1_hits", "redis_hits"))
if hits == 0:
    print("**Cache not integrated yet**: the server reported no cache hits (`cache_hit` in "
          "`/v2/models/{m}/stats`) for repeated identical requests with `--cache-size 256M` and "
          "`response_cache.enable`, so no cache numbers are reported. The ceiling and the "
          "uncached path measured in the same run:")
    print()
    keep = ("ceiling", "disabled")
else:
    keep = tuple(names)
print(f"Median of {rows[0]['rounds']} interleaved rounds per configuration (requests/s range over the rounds "
      "in brackets; latencies from the median round).")
print()
print("| configuration | concurrency | requests/s | p50 ms | p99 ms | errors | server cache hits / misses |")
print("|---|---:|---:|---:|---:|---:|---:|")
ms = lambda v: f"{float(v) / 1000:.3f}"
for r in rows:
    if r["config"] not in keep:
        continue
    hm = "-" if r["config"] == "ceiling" else f"{r['cache_hits']} / {r['cache_misses']}"
    print(f"| {names[r['config']]} | {r['concurrency']} | {float(r['throughput']):.0f} "
          f"({float(r['throughput_min']):.0f}-{float(r['throughput_max']):.0f}) | {ms(r['p50_us'])} | "
          f"{ms(r['p99_us'])} | {r['errors']} | {hm} |")
print()
if hits == 0:
    print("- Targets (tier-1 hits >= 0.8x the ceiling; all misses <= 5% loss vs disabled): **not measured**.")
    sys.exit(0)
top = str(max(int(r["concurrency"]) for r in rows))
t = lambda cfg: float(by[(cfg, top)]["throughput"])
r1 = t("tier1_hits") / max(t("ceiling"), 1e-9)
print(f"- Tier-1 hits at concurrency {top}: {t('tier1_hits'):.0f}/s = **{r1:.2f}x** the ceiling "
      f"({t('ceiling'):.0f}/s); target >= 0.8x: **{'met' if r1 >= 0.8 else 'NOT met'}**.")
loss = 1 - t("all_misses") / max(t("disabled"), 1e-9)
print(f"- All misses at concurrency {top}: {t('all_misses'):.0f}/s vs {t('disabled'):.0f}/s with the cache disabled "
      f"= **{loss * 100:+.1f}%** loss; target <= 5%: **{'met' if loss <= 0.05 else 'NOT met'}**.")
print(f"- Redis hits at concurrency {top}: {t('redis_hits'):.0f}/s = {t('redis_hits') / max(t('ceiling'), 1e-9):.2f}x "
      f"the ceiling.")
stray = [r for r in rows if r["config"] == "all_misses" and int(r["cache_hits"]) > 0]
if stray:
    print(f"- Note: the all-miss runs saw {sum(int(r['cache_hits']) for r in stray)} server cache hits "
          f"(request bodies repeated within a level).")
PY
cat "$OUT/cache.md"
