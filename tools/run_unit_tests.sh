#!/usr/bin/env bash
# Runs each unit test binary; prints "N passed, M failed" over the binaries.
set -u
pass=0; fail=0; failed=""
for t in "$@"; do
    if "$t" >"$t.log" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $t"; cat "$t.log"; fi
done
echo "unit: $pass passed, $fail failed"
[ -z "$failed" ] || { echo "failed:$failed"; exit 1; }
