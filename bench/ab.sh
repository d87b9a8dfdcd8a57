#!/usr/bin/env bash
# ab.sh - two builds of kiln side by side on the front end's paths: the HTTP
# path (wrk, digits JSON, cache bypassed, concurrency 1 and 64), result cache
# misses against the cache disabled, and dynamic batching on against off
# (kiln bench, binary bodies, concurrency 64). A change that should not
# alter speed is checked here: both servers run at once on this machine and
# the rounds alternate which goes first, so a neighbour's load falls on both.
#
# Usage: bench/ab.sh REV        A = REV (built into build/ab/<sha>), B = build/kiln
#        KILN_A=... KILN_B=... bench/ab.sh
# Environment: ROUNDS (default 5), DURATION (s per measurement, default 5),
# OUT (default build/bench). Writes $OUT/ab.csv (every measurement) and
# $OUT/ab.md: per measurement the median of each side and the median of the
# per-round ratios B/A, with their range.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
ROOT=$PWD

if [ $# -ge 1 ]; then
    sha=$(git rev-parse --short "$1")
    KILN_A=$ROOT/build/ab/$sha/kiln
    if [ ! -x "$KILN_A" ]; then
        src=$ROOT/build/ab/src-$sha
        rm -rf "$src"
        git worktree add --detach "$src" "$sha" >/dev/null
        make -C "$src" --no-print-directory -j2 CUDA=0 BUILD="$ROOT/build/ab/$sha" "$ROOT/build/ab/$sha/kiln" \
            >"$OUT/ab_build.log" 2>&1 || { tail -20 "$OUT/ab_build.log" >&2; exit 1; }
        git worktree remove --force "$src"
    fi
fi
KILN_A=${KILN_A:?KILN_A or a revision}
KILN_B=${KILN_B:-$ROOT/build/kiln}
LOADGEN=$KILN_B # one load generator for both sides
W=$OUT/ab
rm -rf "$W"
mkdir -p "$W"
W=$(cd "$W" && pwd)

# The batching benchmark's digits repository (digits_on: dynamic batching
# without delay, digits_off: none), and digits_cache: digits_on with the
# result cache on.
"$PY" bench/make_batching_repo.py --out "$W" --no-resnet >/dev/null
mkdir -p "$W/repo/digits_cache/1"
cp "$W/repo/digits_on/1/model.onnx" "$W/repo/digits_cache/1/"
"$PY" - "$W/repo/digits_on/config.json" "$W/repo/digits_cache/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["name"] = "digits_cache"
c["response_cache"] = {"enable": True}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
printf '%s' "${DIGITS_JSON%\}}"',"parameters":{"cache":false}}' >"$W/body.json"

declare -A PORT PID
pids=""
trap 'for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
for side in A B; do
    bin=KILN_$side
    PORT[$side]=$(free_port)
    "${!bin}" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "${PORT[$side]}" \
        --log-level warn --cache-size 256M >"$W/kiln_$side.log" 2>&1 &
    PID[$side]=$!
    pids="$pids ${PID[$side]}"
done
for side in A B; do wait_ready "http://127.0.0.1:${PORT[$side]}" "${PID[$side]}" "$W/kiln_$side.log"; done

RAW=$OUT/ab.csv
echo "round,side,measurement,rps,p50_ms,p99_ms,errors" >"$RAW"
# measure ROUND SIDE NAME: one measurement against one side's server
measure() {
    local port=${PORT[$2]} f=$W/$3_$2_r$1 row
    case $3 in
    http_c1 | http_c64)
        wrk_post "http://127.0.0.1:$port/v2/models/digits_on/infer" "${3#http_c}" "$W/body.json" "$f.txt"
        row=$(wrk_row "$f.txt")
        ;;
    *)
        local model args=(--unique 64)
        case $3 in
        miss_c64) model=digits_cache args=(--unique 2000000 --seed "$((1000 + $1))") ;;
        nocache_c64) model=digits_on args=(--unique 2000000 --seed "$((1000 + $1))") ;;
        batch_on_c64) model=digits_on ;;
        batch_off_c64) model=digits_off ;;
        esac
        "$LOADGEN" bench -u "127.0.0.1:$port" -m "$model" -c 64 -d "$DURATION" --warmup 1 --no-progress \
            --csv "$f.csv" "${args[@]}" >"$f.txt" 2>&1 || { cat "$f.txt" >&2; return 1; }
        row=$(tail -n 1 "$f.csv" | awk -F, '{ printf "%s %.3f %.3f %d", $9, $10 / 1000, $13 / 1000, $7 }')
        ;;
    esac
    echo "$1,$2,$3,${row// /,}" | tee -a "$RAW"
}

MEASUREMENTS="http_c1 http_c64 miss_c64 nocache_c64 batch_on_c64 batch_off_c64"
for r in $(seq 1 "$ROUNDS"); do
    for m in $MEASUREMENTS; do
        if [ $((r % 2)) = 1 ]; then measure "$r" A "$m"; measure "$r" B "$m"
        else measure "$r" B "$m"; measure "$r" A "$m"; fi
    done
done

"$PY" - "$RAW" "$KILN_A" "$KILN_B" >"$OUT/ab.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["measurement"], {}).setdefault(r["round"], {})[r["side"]] = r
print(f"A: `{sys.argv[2]}`, B: `{sys.argv[3]}`; {len({r['round'] for r in rows})} rounds, alternating which side goes first.\n")
print("| measurement | A requests/s (median) | B requests/s (median) | B/A per round: median (range) | A p99 ms | B p99 ms | errors A/B |")
print("|---|---:|---:|---:|---:|---:|---:|")
for m, rounds in by.items():
    pairs = [v for v in rounds.values() if "A" in v and "B" in v]
    a = [float(v["A"]["rps"]) for v in pairs]
    b = [float(v["B"]["rps"]) for v in pairs]
    ratio = sorted(y / x for x, y in zip(a, b) if x > 0)
    p99 = lambda s: statistics.median(float(v[s]["p99_ms"]) for v in pairs)
    err = lambda s: sum(int(v[s]["errors"]) for v in pairs)
    print(f"| {m} | {statistics.median(a):.0f} | {statistics.median(b):.0f} | {statistics.median(ratio):.3f} "
          f"({ratio[0]:.3f}-{ratio[-1]:.3f}) | {p99('A'):.3f} | {p99('B'):.3f} | {err('A')}/{err('B')} |")
for side in "AB":
    med = {m: statistics.median(float(v[side]["rps"]) for v in rounds.values() if side in v) for m, rounds in by.items()}
    if med.get("miss_c64") and med.get("nocache_c64"):
        print(f"\n- {side}: all misses cost {100 * (1 - med['miss_c64'] / med['nocache_c64']):+.1f}% throughput against the cache disabled (medians).", end="")
print()
PY
cat "$OUT/ab.md"
