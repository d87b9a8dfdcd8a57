# Shared helpers for the bench/*.sh scripts (sourced).
# shellcheck shell=bash
KILN=${KILN:-build/kiln}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-build/bench}
DURATION=${DURATION:-10}
mkdir -p "$OUT"

# bench_dir NAME: W, a fresh absolute $OUT/NAME, once $KILN is known to be built.
bench_dir() {
    [ -x "$KILN" ] || { echo "$1: $KILN not built (make)" >&2; exit 1; }
    W=$OUT/$1
    rm -rf "$W"
    mkdir -p "$W"
    W=$(cd "$W" && pwd)
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_ready URL PID LOG
wait_ready() {
    for _ in $(seq 1 600); do
        curl -sf "$1/v2/health/ready" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || { echo "server exited:" >&2; cat "$3" >&2; return 1; }
        sleep 0.1
    done
    echo "server not ready: $1" >&2
    return 1
}

# "1.23ms" / "850.00us" / "1.05s" -> milliseconds
to_ms() {
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

# The digits request the README shows, as JSON.
DIGITS_JSON='{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}]}'

# wrk_post URL CONCURRENCY BODYFILE OUTFILE [DURATION]: JSON POST with keep-alive.
wrk_post() {
    local lua=$OUT/post_json.lua t=$(( $2 < 2 ? $2 : 2 ))
    cat >"$lua" <<'LUA'
local f = assert(io.open(os.getenv("KILN_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
LUA
    KILN_BODY=$3 wrk -t"$t" -c"$2" -d"${5:-$DURATION}s" --timeout 30s --latency -s "$lua" "$1" >"$4" 2>&1 || true
}

# wrk_row FILE -> "rps p50_ms p99_ms errors"
wrk_row() {
    local f=$1 rps p50 p99 errs
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$f")
    p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$f")")
    p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$f")")
    errs=$(awk '/Non-2xx or 3xx responses:/ { n += $NF } /Socket errors:/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$f")
    echo "${rps:-0} $p50 $p99 $errs"
}

# alternate ROUND FN A B ARGS...: FN ROUND A ARGS... and FN ROUND B ARGS...,
# B first in even rounds, so that neither side always runs first.
alternate() {
    local r=$1 fn=$2 a=$3 b=$4
    shift 4
    if [ $((r % 2)) = 1 ]; then "$fn" "$r" "$a" "$@"; "$fn" "$r" "$b" "$@"
    else "$fn" "$r" "$b" "$@"; "$fn" "$r" "$a" "$@"; fi
}
