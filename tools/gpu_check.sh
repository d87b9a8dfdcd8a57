#!/usr/bin/env bash
# gpu_check.sh - everything about kiln's CUDA backend that needs a real GPU,
# in one run of a few minutes, on a machine that has none of kiln's Debian
# libraries (only a driver, the CUDA toolkit, Python with numpy/onnx, and the
# cuBLAS/cuDNN wheels PyTorch brings).
#
#   tools/gpu_check.sh --bundle    (here; `make gpu-bundle`) packs kiln, the
#       plugin, the GPU op test, the conformance runner, their non-CUDA shared
#       libraries and a symbolic-batch ResNet-50 into
#       build/gpu-bundle/kiln-gpu-bundle.tar.gz (at most 64 MiB)
#   tools/gpu_check.sh --dry-run   (here; `make gpu-check`) unpacks the bundle
#       and checks it: every library resolves but CUDA's, kiln starts, doctor
#       says "no GPU" with exit 2, the emulated op test passes from the bundle
#   tools/gpu_check.sh             (on the GPU machine, from the repo root with
#       build/gpu-bundle carried along) runs, each with a time limit:
#         kiln doctor (driver, devices, GEMM/Conv self-tests, TFLOP/s)
#         the op-consistency test on the GPU (every custom kernel, cuBLASLt,
#         cuDNN vs the CPU backend), then under compute-sanitizer if present
#         ONNX conformance on --backend cuda (when the runner has the flag)
#         the digits model served with --backend cuda: accuracy on the
#         held-out split, compared with --backend cpu
#         ResNet-50 FP32 (and FP16 when the model config takes it) at batch
#         1, 8, 64 through kiln serve + kiln bench: throughput and p50
#       and writes to $OUT (or build/gpu-check-out): summary.md (the table,
#       printed last), full.log, and one log per long step.
# On the device tool: run "tools/gpu_check.sh" with carry ["build/gpu-bundle"]
# and a timeout of 600 s; the script keeps itself within GPU_CHECK_BUDGET
# (480 s) and always writes the table.
# Exit status: 0 when every check that ran passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BUNDLE_DIR=$BUILD/gpu-bundle
TARBALL=$BUNDLE_DIR/kiln-gpu-bundle.tar.gz
MAX_BYTES=$((64 * 1024 * 1024))

# ---- bundle (here) -------------------------------------------------------------

bundle() {
    local stage=$BUILD/gpu-bundle-stage
    rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$stage/models" "$BUNDLE_DIR" || return 1
    local bins=("$BUILD/kiln" "$BUILD/libkiln_cuda.so" "$BUILD/tests/kernels/test_cuda_gpu"
                "$BUILD/tests/kernels/test_cuda_emu")
    [ -x "$BUILD/tests/conformance/runner" ] && bins+=("$BUILD/tests/conformance/runner")
    for b in "${bins[@]}"; do
        [ -e "$b" ] || { echo "gpu_check: $b is missing: run make gpu-bundle" >&2; return 1; }
        cp "$b" "$stage/bin/" && strip --strip-debug "$stage/bin/$(basename "$b")"
    done
    # Non-CUDA shared libraries: everything ldd resolves except glibc's own,
    # the C++ runtime (the GPU machine's is newer, and cuDNN needs the newer
    # one), and CUDA's (that machine has its own, matching its driver).
    local skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libcudnn|libnvrtc|libnvJitLink)'
    for b in "${bins[@]}"; do
        ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
    done | sort -u | while read -r name path; do
        [[ $name =~ $skip ]] && continue
        cp -L "$path" "$stage/lib/$name"
    done
    # ResNet-50 with a symbolic batch dim (ONNX's light model, as the
    # benchmarks use it), and its model repository entry.
    local py=.venv/bin/python
    if [ -x "$py" ]; then
        "$py" - "$stage/models" <<'EOF' || echo "gpu_check: ResNet-50 not bundled (see above)" >&2
import json, os, shutil, sys, importlib.util
spec = importlib.util.spec_from_file_location("evo", "bench/engine_vs_ort.py")
evo = importlib.util.module_from_spec(spec); spec.loader.exec_module(evo)
import onnx
dst = sys.argv[1]
path = evo.symbolic_batch_resnet(dst)
m = onnx.load(path)
inits = {i.name for i in m.graph.initializer}
def io(v):
    t = v.type.tensor_type
    return {"name": v.name, "data_type": "TYPE_FP32", "dims": [d.dim_value for d in t.shape.dim][1:]}
for prec, dirname in (("fp32", "repo_float32"), ("fp16", "repo_mixed")):
    d = os.path.join(dst, dirname, "resnet50")
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    shutil.copyfile(path, os.path.join(d, "1", "model.onnx"))
    cfg = {"name": "resnet50", "platform": "onnxruntime_onnx", "max_batch_size": 64,
           "input": [io(v) for v in m.graph.input if v.name not in inits],
           "output": [io(v) for v in m.graph.output],
           "instance_group": [{"count": 1, "kind": "KIND_AUTO"}]}
    if prec == "fp16":
        cfg["optimization"] = {"precision": "fp16", "cuda_graphs": True}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
os.remove(path)
print("gpu_check: ResNet-50 (symbolic batch) bundled")
EOF
    fi
    # The digits model again, as an FP16 device plan.
    mkdir -p "$stage/models/repo_digits_fp16/digits/1" &&
        cp model_repository/digits/1/model.onnx "$stage/models/repo_digits_fp16/digits/1/" &&
        python3 - "$stage/models/repo_digits_fp16/digits/config.json" <<'EOF2' || echo "gpu_check: digits FP16 not bundled" >&2
import json, sys
cfg = json.load(open("model_repository/digits/config.json"))
cfg["optimization"] = {"precision": "fp16"}
json.dump(cfg, open(sys.argv[1], "w"), indent=1)
EOF2
    git rev-parse HEAD >"$stage/REVISION" 2>/dev/null || echo unknown >"$stage/REVISION"
    (cd "$stage" && find . -type f -o -type l | sort) >"$stage/MANIFEST"
    tar -C "$stage" -czf "$TARBALL" . || return 1
    local size
    size=$(stat -c %s "$TARBALL")
    if [ "$size" -gt "$MAX_BYTES" ]; then
        echo "gpu_check: $TARBALL is $size bytes, over the 64 MiB a device call carries" >&2
        return 1
    fi
    echo "gpu_check: bundle $TARBALL: $((size / 1024 / 1024)) MiB ($size bytes), $(wc -l <"$stage/MANIFEST") files"
}

unpack() {
    local dst=$1
    [ -f "$TARBALL" ] || { echo "gpu_check: $TARBALL is missing (carry build/gpu-bundle; make gpu-bundle builds it)" >&2; return 1; }
    rm -rf "$dst" && mkdir -p "$dst" && tar -C "$dst" -xzf "$TARBALL"
}

# ---- dry run (here) --------------------------------------------------------------

dry_run() {
    local dst=$BUILD/gpu-bundle-dry
    unpack "$dst" || return 1
    local bad=0
    export LD_LIBRARY_PATH="$dst/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for b in "$dst"/bin/*; do
        local missing
        missing=$(ldd "$b" 2>/dev/null | grep "not found" | grep -vE 'libcuda\.so|libcublas|libcudnn|libcudart' || true)
        if [ -n "$missing" ]; then
            echo "gpu_check: $(basename "$b") needs libraries the bundle lacks:"; echo "$missing"; bad=1
        fi
    done
    "$dst/bin/kiln" --version || bad=1
    "$dst/bin/kiln" doctor --no-self-test >"$dst/doctor.txt" 2>&1
    local rc=$?
    if [ $rc -ne 2 ] && ! command -v nvidia-smi >/dev/null; then
        echo "gpu_check: kiln doctor exited $rc on a machine without a GPU (expected 2):"; cat "$dst/doctor.txt"; bad=1
    fi
    grep -q "CUDA plugin: .*gpu-bundle-dry/bin/libkiln_cuda.so" "$dst/doctor.txt" || { echo "gpu_check: the bundled kiln did not load the bundled plugin"; cat "$dst/doctor.txt"; bad=1; }
    "$dst/bin/test_cuda_emu" >"$dst/emu.log" 2>&1 || { echo "gpu_check: the emulated op test failed from the bundle"; tail -20 "$dst/emu.log"; bad=1; }
    [ -f "$dst/models/repo_float32/resnet50/1/model.onnx" ] || { echo "gpu_check: ResNet-50 missing from the bundle"; bad=1; }
    [ $bad -eq 0 ] && echo "gpu_check: dry run OK: the bundle unpacks, its libraries resolve (CUDA's come from the GPU machine), kiln loads the plugin, doctor exits $rc here, the emulated op test passes"
    return $bad
}

# ---- on the GPU machine ---------------------------------------------------------------

OUTDIR=${OUT:-$BUILD/gpu-check-out}
# GPU_CHECK_BACKEND=cpu walks the serving and benchmark steps on the CPU, to
# check this script itself on a machine without a GPU.
GPU_BACKEND=${GPU_CHECK_BACKEND:-cuda}
ROWS=()
FAILED=0

row() { ROWS+=("| $1 | $2 | $3 |"); [ "$2" = FAIL ] && FAILED=1; echo "== $1: $2 -- $3" | tee -a "$OUTDIR/full.log"; }

# The whole run stays inside GPU_CHECK_BUDGET seconds (default 480, under
# the 10 minutes one device command may take) so that the table is always
# written: each step's limit is cut to what is left.
BUDGET=${GPU_CHECK_BUDGET:-480}

# Runs a step with a time limit, its output appended to full.log and to its own log.
step() {
    local name=$1 limit=$2 log=$3; shift 3
    local left=$((BUDGET - SECONDS - 60))
    if [ $left -lt 10 ]; then
        echo "== $name: skipped, out of time" | tee "$OUTDIR/$log" >>"$OUTDIR/full.log"
        return 124
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit}s): $*" >>"$OUTDIR/full.log"
    timeout --kill-after=10 "$limit" "$@" >"$OUTDIR/$log" 2>&1
    local rc=$?
    cat "$OUTDIR/$log" >>"$OUTDIR/full.log"
    return $rc
}

# cuBLAS and cuDNN: the toolkit's, else the wheels beside PyTorch.
cuda_lib_path() {
    local dirs=() d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && dirs+=("$d"); done
    local py
    for py in python3 /opt/torch/.venv/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <("$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
seen = set()
for r in roots:
    for pat in ("nvidia/*/lib", "nvidia/cu13/lib", "nvidia/cu13/lib64"):
        for d in glob.glob(os.path.join(r, pat)):
            if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
                seen.add(d); print(d)
EOF
        )
        break
    done
    local IFS=:
    echo "${dirs[*]}"
}

wait_ready() { # port pid model
    local i
    for i in $(seq 1 300); do
        kill -0 "$2" 2>/dev/null || return 1
        python3 - "$1" "$3" <<'EOF' >/dev/null 2>&1 && return 0
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/models/{sys.argv[2]}/ready", timeout=1)
EOF
        sleep 0.2
    done
    return 1
}

digits_accuracy() { # backend port [repository] -> prints accuracy
    local backend=$1 port=$2 repo=${3:-model_repository}
    "$KILN" serve --backend "$backend" --model-repository "$repo" --http-port "$port" \
        >>"$OUTDIR/digits_$backend.log" 2>&1 &
    local pid=$!
    if ! wait_ready "$port" $pid digits; then kill $pid 2>/dev/null; wait $pid 2>/dev/null; return 1; fi
    python3 - "$port" <<'EOF'
import json, sys, urllib.error, urllib.request
import numpy as np
x = np.load("tests/data/digits_test_x.npy").astype(np.float32)
y = np.load("tests/data/digits_test_y.npy")
labels = []
for i in range(0, len(x), 64):  # max_batch_size
    xb = x[i:i + 64]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(xb.shape), "data": xb.ravel().tolist()}],
            "outputs": [{"name": "label"}]}
    req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v2/models/digits/infer", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        out = json.load(urllib.request.urlopen(req, timeout=60))
    except urllib.error.HTTPError as e:
        sys.exit(f"HTTP {e.code}: {e.read().decode()[:300]}")
    labels += [o for o in out["outputs"] if o["name"] == "label"][0]["data"]
label = np.array(labels).reshape(y.shape)
print(f"{(label == y).mean():.4f}")
EOF
    local rc=$?
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    return $rc
}

resnet_bench() { # precision port
    if [ $((BUDGET - SECONDS)) -lt 90 ]; then row "ResNet-50 $1" SKIP "out of time (GPU_CHECK_BUDGET=$BUDGET s)"; return; fi
    local prec=$1 port=$2 repo="$DST/models/repo_float32"
    [ "$prec" = fp16 ] && repo="$DST/models/repo_mixed"
    [ -d "$repo" ] || { row "ResNet-50 $prec" SKIP "not in the bundle"; return; }
    "$KILN" serve --backend "$GPU_BACKEND" --model-repository "$repo" --http-port "$port" >"$OUTDIR/serve_resnet_$prec.log" 2>&1 &
    local pid=$!
    if ! wait_ready "$port" $pid resnet50; then
        kill $pid 2>/dev/null; wait $pid 2>/dev/null
        local why
        why=$(grep -m1 -iE "error|invalid|unknown|fp16|precision" "$OUTDIR/serve_resnet_$prec.log" | cut -c1-160)
        if [ "$prec" = fp16 ]; then row "ResNet-50 FP16" SKIP "kiln serve refused the fp16 config: ${why:-see serve_resnet_fp16.log}"
        else row "ResNet-50 FP32" FAIL "kiln serve --backend cuda did not become ready: ${why:-see serve_resnet_fp32.log}"; fi
        return
    fi
    if [ "$prec" = fp16 ] && ! grep -q "on $GPU_BACKEND: precision fp16" "$OUTDIR/serve_resnet_$prec.log"; then
        row "ResNet-50 FP16" SKIP "kiln loaded the model but did not say it runs it in FP16 on $GPU_BACKEND (see full.log); FP16 tensor-core speed: doctor's GEMM FP16 self-test"
        kill $pid 2>/dev/null; wait $pid 2>/dev/null
        return
    fi
    local b
    for b in 1 8 64; do
        "$KILN" bench -u "127.0.0.1:$port" -m resnet50 -b "$b" -c 2 -d 5 --warmup 2 --no-progress \
            --csv "$OUTDIR/bench.csv" >>"$OUTDIR/full.log" 2>&1
        local line
        line=$(awk -F, -v b="$b" 'NR > 1 && $1 == "resnet50" && $5 == b {l = $0} END {print l}' "$OUTDIR/bench.csv" 2>/dev/null)
        if [ -n "$line" ]; then
            local thr p50 err nreq
            thr=$(echo "$line" | cut -d, -f9); p50=$(echo "$line" | cut -d, -f10); err=$(echo "$line" | cut -d, -f7)
            nreq=$(echo "$line" | cut -d, -f6)
            row "ResNet-50 ${prec^^} batch $b" "$([ "$err" = 0 ] && [ "${nreq:-0}" -gt 0 ] && echo PASS || echo FAIL)" \
                "$thr images/s, p50 $(awk -v u="$p50" 'BEGIN {printf "%.2f", u / 1000}') ms ($nreq requests at concurrency 2, $err errors)"
        else
            row "ResNet-50 ${prec^^} batch $b" FAIL "kiln bench wrote no result (see full.log)"
        fi
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
}

on_gpu() {
    mkdir -p "$OUTDIR"
    : >"$OUTDIR/full.log"
    DST=/tmp/kiln-gpu-bundle
    unpack "$DST" || return 1
    KILN=$DST/bin/kiln
    export LD_LIBRARY_PATH="$DST/lib:$(cuda_lib_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export KILN_CUDA_PLUGIN=$DST/bin/libkiln_cuda.so
    {
        echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), bundle revision $(cat "$DST/REVISION")"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    } | tee -a "$OUTDIR/full.log"

    # 1. doctor: versions, devices, self-tests.
    step doctor 90 doctor.txt "$KILN" doctor
    local rc=$?
    local st
    st=$(grep -E "GEMM|Conv" "$OUTDIR/doctor.txt" | sed 's/^ *//' | tr '\n' ';' | cut -c1-300)
    case $rc in
    0) row "kiln doctor" PASS "exit 0; $st" ;;
    *) row "kiln doctor" FAIL "exit $rc; $(grep -m1 -E 'GPU|FAILED|WRONG|plugin' "$OUTDIR/doctor.txt" | cut -c1-200)" ;;
    esac

    # 2. op consistency on the GPU: every kernel family, cuBLASLt and cuDNN
    # against the CPU backend, then ONNX's node tests through the real CUDA
    # backend (the engine falls back to the CPU for nodes it refuses).
    NODE_DATA=$(python3 -c 'import os, onnx; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node"))' 2>/dev/null)
    KILN_ONNX_NODE_TESTS="$NODE_DATA" step op-test 150 op_test.log "$DST/bin/test_cuda_gpu"
    rc=$?
    local cases
    cases=$(grep -E "cases, [0-9]+ failed" "$OUTDIR/op_test.log" | awk '{n += $(NF-3); f += $(NF-1)} END {printf "%d cases, %d failed", n, f}')
    cases="$cases; $(grep -m1 -o 'ONNX node tests through the CUDA path: [^(]*' "$OUTDIR/op_test.log" || echo 'node tests: no result')"
    cases="$cases; $(grep -m1 -o 'ONNX light models through the CUDA path: .*' "$OUTDIR/op_test.log" || echo 'light models: no result')"
    [ $rc -eq 0 ] && row "op consistency (GPU vs CPU)" PASS "$cases" || row "op consistency (GPU vs CPU)" FAIL "exit $rc; $cases; see op_test.log"

    # 3. compute-sanitizer on the op test.
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    if [ -n "$cs" ]; then
        KILN_CUDA_TEST_QUICK=1 step sanitizer 120 sanitizer.log "$cs" --tool memcheck --error-exitcode 9 "$DST/bin/test_cuda_gpu"
        rc=$?
        if [ $rc -eq 0 ]; then row "compute-sanitizer memcheck" PASS "no errors"
        elif grep -qiE "not supported|Device not supported|error 999" "$OUTDIR/sanitizer.log"; then
            row "compute-sanitizer memcheck" SKIP "the sanitizer cannot attach here: $(grep -m1 -iE 'not supported|error' "$OUTDIR/sanitizer.log" | cut -c1-120)"
        else row "compute-sanitizer memcheck" FAIL "exit $rc; $(grep -m1 -E 'ERROR SUMMARY|Invalid' "$OUTDIR/sanitizer.log" | cut -c1-160)"; fi
    else
        row "compute-sanitizer memcheck" SKIP "compute-sanitizer not installed"
    fi

    # 4. conformance on --backend cuda.
    local runner=$DST/bin/runner data
    data=$(python3 -c 'import os, onnx; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data"))' 2>/dev/null)
    if [ ! -x "$runner" ]; then row "conformance --backend cuda" SKIP "runner not in the bundle"
    elif ! "$runner" --help 2>&1 | grep -q -- "--backend"; then row "conformance --backend cuda" SKIP "the conformance runner has no --backend option yet"
    elif [ -z "$data" ]; then row "conformance --backend cuda" SKIP "no onnx package for the test data"
    else
        step conformance 150 conformance.log "$runner" --backend cuda --data "$data" --skip tests/conformance/skip.txt
        rc=$?
        row "conformance --backend cuda" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$OUTDIR/conformance.log" | cut -c1-200)"
    fi

    # 5. digits end to end on cuda vs cpu.
    local acc_gpu acc_cpu
    acc_gpu=$(digits_accuracy "$GPU_BACKEND" 18531) || acc_gpu=""
    acc_cpu=$(digits_accuracy cpu 18532) || acc_cpu=""
    if [ -z "$acc_gpu" ]; then row "digits e2e --backend cuda" FAIL "no answer (see digits_cuda.log in full.log)"; cat "$OUTDIR"/digits_"$GPU_BACKEND".log >>"$OUTDIR/full.log" 2>/dev/null
    elif [ "$acc_gpu" = "$acc_cpu" ] && awk -v a="$acc_gpu" 'BEGIN {exit !(a >= 0.95)}'; then row "digits e2e --backend cuda" PASS "accuracy $acc_gpu (CPU $acc_cpu)"
    else row "digits e2e --backend cuda" FAIL "accuracy $acc_gpu vs CPU ${acc_cpu:-?}"; fi
    # FP16 device plan: labels may differ from the CPU's on at most 0.5% of the samples.
    local acc16=""
    if [ -d "$DST/models/repo_digits_fp16" ]; then
        acc16=$(digits_accuracy "$GPU_BACKEND" 18535 "$DST/models/repo_digits_fp16") || acc16=""
        if [ -z "$acc16" ]; then row "digits e2e FP16 --backend cuda" FAIL "no answer (see full.log)"
        elif [ -n "$acc_cpu" ] && awk -v a="$acc16" -v c="$acc_cpu" 'BEGIN {d = a - c; if (d < 0) d = -d; exit !(d <= 0.005)}'; then
            row "digits e2e FP16 --backend cuda" PASS "accuracy $acc16 (CPU FP32 $acc_cpu)"
        else row "digits e2e FP16 --backend cuda" FAIL "accuracy $acc16 vs CPU FP32 ${acc_cpu:-?}"; fi
    fi
    cat "$OUTDIR"/digits_*.log >>"$OUTDIR/full.log" 2>/dev/null; rm -f "$OUTDIR"/digits_*.log

    # 6. ResNet-50 benchmarks.
    resnet_bench fp32 18533
    resnet_bench fp16 18534
    cat "$OUTDIR"/serve_resnet_*.log >>"$OUTDIR/full.log" 2>/dev/null; rm -f "$OUTDIR"/serve_resnet_*.log

    {
        echo "## $(date -u +%Y-%m-%d) -- $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), bundle $(cut -c1-12 "$DST/REVISION")"
        echo
        echo "| check | result | details |"
        echo "| --- | --- | --- |"
        printf '%s\n' "${ROWS[@]}"
    } >"$OUTDIR/summary.md"
    echo
    cat "$OUTDIR/summary.md"
    return $FAILED
}

case "${1:-}" in
--bundle) bundle ;;
--dry-run) dry_run ;;
"") on_gpu ;;
-h | --help) sed -n '2,30p' "$0" ;;
*) echo "usage: tools/gpu_check.sh [--bundle | --dry-run]" >&2; exit 2 ;;
esac
