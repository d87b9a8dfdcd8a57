#!/usr/bin/env bash
# modelset.sh - kiln's CPU engine against onnxruntime, and OpenVINO where
# .venv-bench has it (requirements-bench.txt), on the real-model set:
# torchvision and timm CNNs and vision transformers, transformers text,
# decoder and audio models (small configs), INT8 variants from
# onnxruntime.quantization; see bench/models/make_set.py. For each model and
# thread count (1 and 2), alternating rounds of `kiln run --backend cpu` and
# onnxruntime in one process (bench/modelset.py), medians of each side's p50.
# Writes $OUT/modelset.csv and $OUT/modelset.md (CPU=avx2: modelset_avx2.*).
#
# The set is built once into MODELSET (default build/modelset) by the
# generator, which needs torch, torchvision, timm and transformers:
#     python3 -m venv .venv-models
#     .venv-models/bin/pip install -r bench/models/requirements.txt
# MODELS_PY (default .venv-models/bin/python) names that Python. Without it
# the models that need no torch (make_set.py --without-torch: recurrent
# models, SVC) are built with the project's Python and measured with any
# already built; only if that fails too and nothing is built does the section
# write why it was skipped and succeed, so `make bench` does not fail for
# want of torch.
# Environment: MODELSET, MODELS_PY, THREADS ("1,2"), ROUNDS (3), BUDGET_MS
# (timed loop per side and round, 300), ONLY (comma-separated model names),
# CPU (native, or avx2: both sides, and everything else in the process, see
# an AVX2-only CPU through bench/cpuid_avx2.c; writes modelset_avx2.*).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-build/bench}
PY=${PY:-$ROOT/.venv/bin/python}
KILN=${KILN:-build/kiln}
MODELSET=${MODELSET:-build/modelset}
MODELS_PY=${MODELS_PY:-.venv-models/bin/python}
mkdir -p "$OUT"
name=modelset
[ "${CPU:-native}" != avx2 ] || name=modelset_avx2

skip() { # WHY [HOW-TO-RUN-IT]
    {
        echo "**Skipped**: $1"
        echo
        echo "${2:-To run it: \`python3 -m venv .venv-models && .venv-models/bin/pip install -r bench/models/requirements.txt\`,
then \`make bench\` again (or \`MODELS_PY=/path/to/python\` naming a Python with those packages).}"
    } >"$OUT/$name.md"
    rm -f "$OUT/$name.csv"
    echo "modelset.sh: skipped: $1" >&2
    exit 0
}

# An AVX2-only view of this CPU needs CPUID faulting (bench/cpuid_avx2.c):
# without it onnxruntime would run its AVX-512 code against kiln's AVX2.
if [ "$name" = modelset_avx2 ] && ! grep -qw cpuid_fault /proc/cpuinfo; then
    skip "this CPU ($(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')) or its kernel cannot make CPUID fault (no \`cpuid_fault\` in /proc/cpuinfo), so onnxruntime cannot be shown an AVX2-only CPU here and a comparison would set kiln's AVX2 code against onnxruntime's AVX-512." \
        "Run it on an AVX2-only machine as the native section, or on one whose /proc/cpuinfo lists \`cpuid_fault\` (most Intel CPUs since Ivy Bridge under Linux)."
fi

# Build what is missing (make_set.py keeps models already built by its version).
made=""
if "$MODELS_PY" -c 'import torch, torchvision, timm, transformers, onnx' 2>/dev/null; then
    if ! "$MODELS_PY" bench/models/make_set.py --out "$MODELSET" --ort-python "$PY" >"$OUT/modelset_make.log" 2>&1; then
        # Benchmark what was built; the report names what was not.
        made=$(grep -E '^make_set: .*(failed|missing)' "$OUT/modelset_make.log" | sed 's/^make_set: /- /')
        echo "modelset.sh: make_set.py reported failures; see $OUT/modelset_make.log" >&2
    fi
elif "$PY" bench/models/make_set.py --out "$MODELSET" --without-torch >"$OUT/modelset_make.log" 2>&1; then
    # The recurrent and classical models need no torch: the set is at least
    # those, with any torch exports a generator built earlier.
    made="- the torch exports, where not built earlier: torch, torchvision, timm and transformers are missing for $MODELS_PY"
    echo "modelset.sh: no generator at $MODELS_PY; the models built without torch and those already in $MODELSET" >&2
elif ! compgen -G "$MODELSET/*/outputs" >/dev/null; then
    skip "the model set is not built ($MODELSET) and the generator's packages (torch, torchvision, timm, transformers) are missing for $MODELS_PY."
else
    echo "modelset.sh: no generator at $MODELS_PY; using the models already in $MODELSET" >&2
fi

cpu_env=()
if [ "$name" = modelset_avx2 ]; then
    make --no-print-directory build/libcpuid_avx2.so >/dev/null
    # CPUID answered without AVX-512, VNNI and AMX for Python, onnxruntime and
    # kiln alike; glibc's own string functions capped by its tunables.
    cpu_env=(env LD_AUDIT="$ROOT/build/libcpuid_avx2.so"
             GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX_VNNI)
    "${cpu_env[@]}" "$PY" -c 'import numpy' || { echo "modelset.sh: CPU=avx2 needs CPUID faulting (cpuid_fault)" >&2; exit 1; }
fi

"${cpu_env[@]}" "$PY" bench/modelset.py --set "$MODELSET" --kiln "$KILN" --threads "${THREADS:-1,2}" --rounds "${ROUNDS:-3}" \
    --budget-ms "${BUDGET_MS:-300}" ${ONLY:+--only "$ONLY"} --csv "$OUT/$name.csv" >"$OUT/$name.txt"
{
    echo "Command: \`bench/modelset.sh\` (\`kiln run --backend cpu --iterations N\` vs onnxruntime's"
    echo "InferenceSession.run() and OpenVINO's infer() (FP32 precision hint, latency hint, static input shapes;"
    echo "bench/openvino_worker.py) on the same seeded inputs, same intra-op threads, ${ROUNDS:-3} rotating rounds,"
    echo "median of each side's p50; the models from bench/models/make_set.py with seeded weights)."
    echo "kiln/ORT = kiln / onnxruntime, kiln/best = kiln / the faster of onnxruntime and OpenVINO (lower is"
    echo "better for kiln); the last column compares kiln's and OpenVINO's outputs with onnxruntime's. The peers'"
    echo "times include Python's call overhead (a few microseconds), which counts only for the sub-millisecond"
    echo "models. Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
    if [ "$name" = modelset_avx2 ]; then
        echo
        echo "CPU: this machine seen as AVX2-only by both sides (\`CPU=avx2\`: bench/cpuid_avx2.c answers CPUID"
        echo "without AVX-512, VNNI and AMX), so onnxruntime's MLAS and kiln's oneDNN both run their AVX2 code."
    fi
    echo
    cat "$OUT/$name.txt"
    if [ -n "$made" ]; then
        echo
        echo "Models the generator could not build (bench/models/make_set.py, log in $OUT/modelset_make.log):"
        echo
        echo "$made"
    fi
} >"$OUT/$name.md"
cat "$OUT/$name.md"
