#!/usr/bin/env bash
# shm.sh - system shared memory vs the binary body for a large input, side by
# side in one run: a model with one 1x1M FP32 input (4 MiB) summed to one
# number (ReduceSum, so the answer is small and the input path is what is
# measured), driven by `kiln bench` over HTTP, closed loop, with the inputs
#   body   in the request body (the binary tensor extension)
#   shm    in POSIX shared memory registered with the server (--shared-memory)
# in alternating rounds per concurrency level. The server's cache is off.
# Writes $OUT/shm.csv (median of the rounds) and $OUT/shm.md.
#
# Environment: DURATION (s per level and round, default 10), ROUNDS (3),
# CONCURRENCY ("1 4"), KILN (build/kiln), OUT (build/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
CONCURRENCY=${CONCURRENCY:-"1 4"}
ROUNDS=${ROUNDS:-3}
W=$OUT/shm
rm -rf "$W"
mkdir -p "$W/repo/sum1m/1"
W=$(cd "$W" && pwd)
[ -x "$KILN" ] || { echo "shm.sh: $KILN not built (make)" >&2; exit 1; }

"$PY" - "$W/repo/sum1m/1/model.onnx" <<'PY'
import sys
import onnx
import onnx.helper as oh
from onnx import TensorProto as TP
g = oh.make_graph([oh.make_node("ReduceSum", ["x"], ["sum"], keepdims=1)], "sum1m",
                  [oh.make_tensor_value_info("x", TP.FLOAT, [1, 1 << 20])],
                  [oh.make_tensor_value_info("sum", TP.FLOAT, [1, 1])])
m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
PY
echo '{"max_batch_size": 0}' >"$W/repo/sum1m/config.json"

port=$(free_port)
"$KILN" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "$port" --cache-size 0 \
    --max-request-size 64M --allow-client-shm >"$W/kiln.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$port" "$pid" "$W/kiln.log"

RAW=$W/rounds.csv
echo "round,mode,concurrency,throughput,p50_us,p99_us,errors" >"$RAW"
one() { # ROUND MODE CONCURRENCY
    local f=$W/$2_c$3_r$1 flag=
    [ "$2" = shm ] && flag=--shared-memory
    # Four distinct inputs: the bench makes one 4 MiB object (or body) each.
    "$KILN" bench -u "127.0.0.1:$port" -m sum1m -c "$3" -d "$DURATION" --no-progress --unique 4 --seed "$1" \
        $flag --csv "$f.csv" >"$f.txt" 2>&1 || { cat "$f.txt" >&2; return 1; }
    tail -n 1 "$f.csv" | awk -F, -v r="$1" -v m="$2" -v c="$3" 'BEGIN { OFS = "," } { print r, m, c, $9, $10, $13, $7 }' |
        tee -a "$RAW"
}
for c in $CONCURRENCY; do
    for r in $(seq 1 "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then one "$r" body "$c"; one "$r" shm "$c"; else one "$r" shm "$c"; one "$r" body "$c"; fi
    done
done
# Nothing the bench registered is left at the server.
left=$(curl -sf "http://127.0.0.1:$port/v2/systemsharedmemory/status")
[ "$left" = "[]" ] || { echo "shm.sh: regions left registered: $left" >&2; exit 1; }

"$PY" - "$RAW" "$OUT/shm.csv" "$DURATION" "$ROUNDS" >"$OUT/shm.md" <<'PY'
import csv, statistics, sys
raw, out, duration, rounds = sys.argv[1:]
rows = list(csv.DictReader(open(raw)))
med = {}
for (m, c) in sorted({(r["mode"], int(r["concurrency"])) for r in rows}, key=lambda k: (k[1], k[0])):
    rs = [r for r in rows if r["mode"] == m and int(r["concurrency"]) == c]
    med[(m, c)] = {k: statistics.median(float(r[k]) for r in rs) for k in ("throughput", "p50_us", "p99_us")}
    med[(m, c)]["errors"] = sum(int(r["errors"]) for r in rs)
with open(out, "w") as f:
    f.write("mode,concurrency,throughput,p50_us,p99_us,errors\n")
    for (m, c), v in med.items():
        f.write(f"{m},{c},{v['throughput']:.1f},{v['p50_us']:.0f},{v['p99_us']:.0f},{v['errors']}\n")
print(f"One FP32 input of 1x1M (4 MiB) summed by the model (ReduceSum), over HTTP with `kiln bench`, closed loop; "
      f"median of {rounds} alternating rounds of {duration} s. `body`: the input in the request (binary tensor "
      "extension); `shm`: the input in POSIX shared memory registered with the server, the request its JSON header "
      "alone.")
print()
print("| concurrency | body req/s | shm req/s | shm / body | body p50 ms | shm p50 ms | body p99 ms | shm p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for c in sorted({c for _, c in med}):
    b, s = med[("body", c)], med[("shm", c)]
    print(f"| {c} | {b['throughput']:.0f} | {s['throughput']:.0f} | {s['throughput'] / b['throughput']:.2f}x | "
          f"{b['p50_us'] / 1000:.2f} | {s['p50_us'] / 1000:.2f} | {b['p99_us'] / 1000:.2f} | {s['p99_us'] / 1000:.2f} | "
          f"{b['errors'] + s['errors']} |")
print()
worst = min(med[("shm", c)]["throughput"] / med[("body", c)]["throughput"] for c in {c for _, c in med})
print(f"- Target: shared memory >= 2x the body's throughput at every level: worst {worst:.2f}x, "
      f"**{'met' if worst >= 2 else 'NOT met'}**.")
PY
cat "$OUT/shm.md"
