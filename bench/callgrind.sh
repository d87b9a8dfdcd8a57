#!/usr/bin/env bash
# callgrind.sh - server instructions per request: kiln under callgrind, one
# client at a time (`kiln bench -c 1`), instrumentation switched on after a
# warm-up and off after N requests, every thread of the server counted (the
# model's included). OpenMP waits passively so that spinning is not counted.
#
# Usage: bench/callgrind.sh [json|binary|grpc ...]   (default: all three)
# Environment: KILN (default build/kiln), N (requests, default 2000), MODEL
# (default digits, from model_repository/). Needs valgrind (Debian's).
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
N=${N:-2000}
MODEL=${MODEL:-digits}
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(json binary grpc)
for mode in "${modes[@]}"; do
    port=$((20000 + RANDOM % 20000))
    GOMP_SPINCOUNT=0 OMP_WAIT_POLICY=PASSIVE KILN_CACHE_SIZE=0 valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$work/cg.out" "$KILN" serve --model-repository model_repository \
        --http-address 127.0.0.1 --http-port "$port" --grpc-port $((port + 1)) --http-threads 1 >"$work/log" 2>&1 &
    vp=$!
    for _ in $(seq 1 240); do curl -sf "localhost:$port/v2/health/ready" >/dev/null && break; sleep 0.5; done
    case $mode in
        json) args=(--json-data) ;;
        binary) args=() ;;
        grpc) args=(-i grpc --grpc-url "127.0.0.1:$((port + 1))") ;;
        *) echo "callgrind.sh: unknown mode '$mode'" >&2; kill "$vp"; exit 2 ;;
    esac
    "$KILN" bench -u "127.0.0.1:$port" -m "$MODEL" "${args[@]}" -n 200 -c 1 >/dev/null
    callgrind_control -i on "$vp" >/dev/null 2>&1
    # --warmup 0: bench's own warm-up second would add an unknown number of
    # requests to the counted ones (100 to 400 here, the main source of the
    # spread between runs).
    "$KILN" bench -u "127.0.0.1:$port" -m "$MODEL" "${args[@]}" -n "$N" -c 1 --warmup 0 >/dev/null
    callgrind_control -i off "$vp" >/dev/null 2>&1
    kill "$vp"
    wait "$vp" 2>/dev/null || true
    total=$(sed -n 's/.*I   refs: *//p' "$work/log" | tr -d ,)
    echo "$mode: $((total / N)) instructions a request ($N requests, $MODEL)"
done
