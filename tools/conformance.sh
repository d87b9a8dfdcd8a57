#!/usr/bin/env bash
# Runs ONNX's backend node tests and the nine light models through kiln.
# Builds the runner if needed; extra arguments go to it, e.g.
#   tools/conformance.sh --filter 'test_conv*' -v
#   tools/conformance.sh --update-skipped   (rewrites tests/conformance/skipped.txt)
# Environment: BUILD (default build), CONFORMANCE_THREADS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
runner="$BUILD/tests/conformance/runner"
make --no-print-directory -j2 "$runner" >/dev/null
data=$(.venv/bin/python -c 'import os, onnx; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data"))' 2>/dev/null \
       || echo .venv/lib/python3.11/site-packages/onnx/backend/test/data)
args=()
for a in "$@"; do
    if [ "$a" = --update-skipped ]; then args+=(--write-skipped tests/conformance/skipped.txt); else args+=("$a"); fi
done
exec "$runner" --data "$data" --skip tests/conformance/skip.txt --threads "${CONFORMANCE_THREADS:-1}" "${args[@]}"
