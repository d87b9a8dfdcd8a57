#!/usr/bin/env bash
# onednn.sh - Debian's oneDNN 2.6.3 (what kiln links) against oneDNN 3.x from
# PyPI, primitive by primitive (bench/onednn/prims.c, built once against each).
# PyPI's current oneDNN (onednn-devel 2026.x, 3.13) is built for TBB and the
# SYCL runtime; kiln sets thread counts per step through OpenMP, so the 3.x it
# could use is the OpenMP build, onednn-cpu-gomp (3.2; it ships no headers:
# they come from onednn-devel, whose 3.x C API is the same for these calls).
# ROUNDS alternating rounds at 1 and 2 threads, on the native ISA and under
# ONEDNN_MAX_CPU_ISA=AVX2; the fastest round of each side is kept.
# Writes $OUT/onednn.md (OUT defaults to build/bench).
# Environment: ROUNDS (2), GOMP_VERSION (2023.2.0), DEVEL_VERSION (2026.1.0).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/bench}
ROUNDS=${ROUNDS:-2}
PY=.venv/bin/python
W=build/onednn3
mkdir -p "$W" "$OUT"
if [ ! -d "$W/gomp" ]; then
    "$PY" -m pip download -q --no-deps "onednn-cpu-gomp==${GOMP_VERSION:-2023.2.0}" -d "$W/whl"
    "$PY" -m pip download -q --no-deps "onednn-devel==${DEVEL_VERSION:-2026.1.0}" -d "$W/whl"
    for f in "$W"/whl/*.whl; do "$PY" -m zipfile -e "$f" "$W/x"; done
    mkdir -p "$W/gomp"
    cp -a "$W"/x/onednn_cpu_gomp-*.data/data/lib/libdnnl.so* "$W/gomp/"
    cp -a "$W"/x/onednn_devel-*.data/data/include "$W/include"
fi
cc -O2 -fopenmp bench/onednn/prims.c -o "$W/prims2" -ldnnl
cc -O2 -fopenmp -I"$W/include" bench/onednn/prims.c -o "$W/prims3" -L"$W/gomp" -l:libdnnl.so.3 -Wl,-rpath,"$(cd "$W/gomp" && pwd)"
# kiln's own OpenMP wait policy (commands/main.c), for both sides.
export OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=20000
R=$W/runs
rm -rf "$R"
mkdir -p "$R"
for isa in ALL AVX2; do
    for t in 1 2; do
        for r in $(seq 1 "$ROUNDS"); do
            ONEDNN_MAX_CPU_ISA=$isa "$W/prims2" "$t" >"$R/v2_${isa}_${t}_$r.txt"
            ONEDNN_MAX_CPU_ISA=$isa "$W/prims3" "$t" >"$R/v3_${isa}_${t}_$r.txt"
        done
    done
done
"$PY" - "$R" "$ROUNDS" "$OUT/onednn.md" <<'PY'
import re, statistics, sys, pathlib
runs, rounds, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def read(f):
    d = {}
    for line in open(f):
        m = re.match(r"(.{34})\s+([\d.]+) us\s+(\S+)", line)
        if m:
            d[m.group(1).strip()] = (float(m.group(2)), m.group(3))
    return d
lines = []
for isa in ("ALL", "AVX2"):
    for t in (1, 2):
        a = [read(runs / f"v2_{isa}_{t}_{r}.txt") for r in range(1, rounds + 1)]
        b = [read(runs / f"v3_{isa}_{t}_{r}.txt") for r in range(1, rounds + 1)]
        lines += [f"\n### {'native ISA' if isa == 'ALL' else 'ONEDNN_MAX_CPU_ISA=AVX2'}, {t} thread{'s' if t > 1 else ''}\n",
                  "| primitive | 2.6.3 us | 3.2 us | 3.2 / 2.6.3 | 2.6.3 kernel | 3.2 kernel |",
                  "|---|---:|---:|---:|---|---|"]
        ratios = []
        for k in a[0]:
            x, y = min(r[k][0] for r in a), min(r[k][0] for r in b)
            ratios.append(y / x)
            lines.append(f"| {k} | {x:.1f} | {y:.1f} | {y / x:.2f} | {a[0][k][1]} | {b[0][k][1]} |")
        lines.append(f"| geometric mean | | | **{statistics.geometric_mean(ratios):.2f}** | | |")
pathlib.Path(out).write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
