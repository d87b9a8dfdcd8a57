#!/usr/bin/env bash
# padding.sh - padded batching against same-shape batching on a BERT-class
# model (tests/data/sequence/bert.onnx: BertModel exported from transformers,
# 2 layers, hidden 128), requests of 1 row whose token count is drawn
# uniformly from 8 to 128 (kiln bench --shape LO-HI, 256 distinct bodies),
# closed loop at concurrency 64 (kiln bench, binary bodies).
#   same    dynamic batching: only requests of one length share a batch
#   padded  sequence_padding on with its defaults (buckets the powers of two
#           from 8 to 512): one batch per length bucket
#   fine    sequence_padding on with finer buckets (BUCKETS), less padding
# Both models are served by one kiln at once, each with one instance and the
# same max_batch_size; ROUNDS rounds alternate which goes first. Reports each
# mode's median round, the paired ratio, the mean batch size and the padding
# waste from the server's statistics.
# Writes $OUT/padding.csv and $OUT/padding.md.
# Environment: ROUNDS (3), DURATION (s per run, 10), CONCURRENCY (64),
# MAX_BATCH (32), BUCKETS ("8,12,16,24,32,48,64,96,128"), LENGTHS ("8-128").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-64}
MAX_BATCH=${MAX_BATCH:-32}
BUCKETS=${BUCKETS:-8,12,16,24,32,48,64,96,128}
MODES="same padded fine"
LENGTHS=${LENGTHS:-8-128}
MODEL=tests/data/sequence/bert.onnx
W=$OUT/padding
rm -rf "$W"
mkdir -p "$W"
W=$(cd "$W" && pwd)
[ -f "$MODEL" ] || { echo "padding.sh: $MODEL missing (tests/models/make_sequence_models.py)" >&2; exit 1; }

for m in $MODES; do
    mkdir -p "$W/repo/bert_$m/1"
    cp "$MODEL" "$W/repo/bert_$m/1/model.onnx"
    case $m in
    same) pad= ;;
    padded) pad=", \"sequence_padding\": {\"enable\": true}" ;;
    fine) pad=", \"sequence_padding\": {\"enable\": true, \"buckets\": [$BUCKETS]}" ;;
    esac
    echo "{\"max_batch_size\": $MAX_BATCH, \"dynamic_batching\": {}, \"instance_group\": [{\"count\": 1}]$pad}" \
        >"$W/repo/bert_$m/config.json"
done
port=$(free_port)
"$KILN" serve --model-repository "$W/repo" --http-address 127.0.0.1 --http-port "$port" --log-level info \
    --cache-size 0 >"$W/kiln.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$port" "$pid" "$W/kiln.log"

# counts MODEL -> "inferences executions real padded"
counts() {
    curl -sf "http://127.0.0.1:$port/v2/models/$1/stats" | "$PY" -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]
p = s.get("padding_stats", [])
print(s["inference_count"], s["execution_count"], sum(x["real_elements"] for x in p), sum(x["padded_elements"] for x in p))'
}

RAW=$W/rounds.csv
echo "round,mode,infer_per_s,p50_ms,p99_ms,errors,mean_batch,waste" >"$RAW"
one() { # ROUND MODE
    local model=bert_$2 f=$W/$2_r$1
    read -r i0 e0 r0 p0 < <(counts "$model")
    "$KILN" bench -u "127.0.0.1:$port" -m "$model" -c "$CONCURRENCY" -d "$DURATION" --warmup 2 --no-progress \
        --unique 256 --seed "$1" --input-data zero --shape "input_ids:1,$LENGTHS" --shape "attention_mask:1,$LENGTHS" \
        --shape "token_type_ids:1,$LENGTHS" --timeout-ms 120000 --csv "$f.csv" >"$f.txt" 2>&1 ||
        { cat "$f.txt" >&2; return 1; }
    sleep 1
    read -r i1 e1 r1 p1 < <(counts "$model")
    tail -n 1 "$f.csv" | awk -F, -v r="$1" -v m="$2" -v i=$((i1 - i0)) -v e=$((e1 - e0)) -v real=$((r1 - r0)) \
        -v pad=$((p1 - p0)) 'BEGIN { OFS = "," } { printf "%s,%s,%s,%.3f,%.3f,%s,%.2f,%s\n", r, m, $9, $10 / 1000,
        $13 / 1000, $7, e ? i / e : 0, pad ? sprintf("%.3f", 1 - real / pad) : "" }' | tee -a "$RAW"
}
for r in $(seq 1 "$ROUNDS"); do
    order=$MODES
    [ $((r % 2)) = 1 ] || order=$(echo "$MODES" | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do one "$r" "$m"; done
done

"$PY" - "$RAW" "$OUT/padding.csv" "$CONCURRENCY" "$LENGTHS" "$BUCKETS" "$MAX_BATCH" >"$OUT/padding.md" <<'PY'
import csv, statistics, sys
raw, out, conc, lengths, buckets, maxb = sys.argv[1:]
rows = list(csv.DictReader(open(raw)))
modes = [m for m in ("same", "padded", "fine") if any(r["mode"] == m for r in rows)]
by = {m: sorted((r for r in rows if r["mode"] == m), key=lambda r: float(r["infer_per_s"])) for m in modes}
med = {m: v[(len(v) - 1) // 2] for m, v in by.items()}
rounds = sorted({r["round"] for r in rows})
def ratios(m):
    get = lambda k, mode: float(next(r for r in rows if r["round"] == k and r["mode"] == mode)["infer_per_s"])
    return sorted(get(k, m) / get(k, "same") for k in rounds)
labels = {"same": "same shape only", "padded": "padded, default buckets (8, 16, ..., 512)",
          "fine": f"padded, buckets {buckets}"}
with open(out, "w") as f:
    f.write("mode,infer_per_s,p50_ms,p99_ms,errors,mean_batch,waste,range,paired_ratio\n")
    for m in modes:
        x = med[m]
        rng = f"{float(by[m][0]['infer_per_s']):.1f}-{float(by[m][-1]['infer_per_s']):.1f}"
        pr = f"{statistics.median(ratios(m)):.3f}" if m != "same" else ""
        f.write(f"{m},{x['infer_per_s']},{x['p50_ms']},{x['p99_ms']},{x['errors']},{x['mean_batch']},{x['waste']},{rng},{pr}\n")
print(f"Command: `ROUNDS={len(rounds)} bench/padding.sh` (BERT, 2 layers, hidden 128, from transformers; one row a request,"
      f" {lengths} tokens uniform; concurrency {conc}; max_batch_size {maxb}; one kiln serving every mode)\n")
print("| batching | infer/s (range over rounds) | paired ratio to same shape | p50 ms | p99 ms | errors | mean batch | padding waste |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for m in modes:
    x = med[m]
    pr = f"{statistics.median(ratios(m)):.2f}" if m != "same" else ""
    print(f"| {labels[m]} | {float(x['infer_per_s']):.1f} ({float(by[m][0]['infer_per_s']):.1f}-{float(by[m][-1]['infer_per_s']):.1f}) "
          f"| {pr} | {float(x['p50_ms']):.2f} | {float(x['p99_ms']):.2f} | {x['errors']} | {x['mean_batch']} | "
          f"{(str(round(100 * float(x['waste']), 1)) + '%') if x['waste'] else '-'} |")
print()
for m in modes[1:]:
    r = ratios(m)
    print(f"- {labels[m]}: **{statistics.median(r):.2f}x** same-shape batching's throughput (median of the paired rounds, "
          f"{r[0]:.2f}-{r[-1]:.2f}); p99 {float(med[m]['p99_ms']):.1f} vs {float(med['same']['p99_ms']):.1f} ms; "
          f"padding waste {100 * float(med[m]['waste']):.1f}% of the tokens run.")
PY
cat "$OUT/padding.md"
