#!/usr/bin/env bash
# End-to-end tests: pytest on tests/e2e with the project's .venv against the
# real build/kiln (KILN_BIN overrides it, e.g. an ASan build). Prints pytest's
# summary; extra arguments go to pytest (e.g. tools/e2e.sh -k infer).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "e2e: .venv is missing: run tools/bootstrap.sh (make bootstrap)" >&2; exit 2; }
[ -x "${KILN_BIN:-build/kiln}" ] || { echo "e2e: ${KILN_BIN:-build/kiln} is missing: run make" >&2; exit 2; }
# --durations: the slowest tests and their time, for keeping the suite short.
exec "$PY" -m pytest -q -p no:cacheprovider --durations=20 tests/e2e "$@"
