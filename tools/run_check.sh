#!/usr/bin/env bash
# The README's first command as a user runs it: `make run` in the background,
# the README's curl example against it once it is ready, then a SIGTERM and a
# clean exit. CI (.ci/run) calls it after `make test` (which built everything).
# Needs port 8000 free, as `make run` does.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp /tmp/kiln-run-check.XXXXXX)
trap 'rm -f "$log"' EXIT
if curl -s -o /dev/null localhost:8000 2>/dev/null; then
    echo "run-check: port 8000 is in use; \`make run\` serves there" >&2
    exit 1
fi
setsid make --no-print-directory run >"$log" 2>&1 &
pid=$!
stop() { kill -TERM -- "-$pid" 2>/dev/null || true; }
ready=0
for _ in $(seq 1 600); do
    if curl -sf localhost:8000/v2/health/ready >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
done
if [ "$ready" != 1 ]; then
    stop
    echo "run-check: \`make run\` did not become ready; its output:" >&2
    tail -40 "$log" >&2
    exit 1
fi
# The README's curl body, taken from the README itself.
body=$(python3 - <<'PY'
import re
s = open("README.md").read()
m = re.search(r"curl -s localhost:8000/v2/models/digits/infer -d '(\{.*?\})'", s, re.S)
print(m.group(1) if m else "")
PY
)
[ -n "$body" ] || { stop; echo "run-check: the README lost its curl example" >&2; exit 1; }
answer=$(curl -s localhost:8000/v2/models/digits/infer -d "$body")
stop
rc=0
wait "$pid" || rc=$?
echo "$answer" | python3 -c '
import json, sys
r = json.load(sys.stdin)
label = [o for o in r["outputs"] if o["name"] == "label"][0]["data"][0]
assert label == 0, f"the README digit is a 0, kiln said {label}"
print("run-check: make run served the README example (label 0)")
' || { echo "run-check: unexpected answer: $answer" >&2; exit 1; }
exit 0
