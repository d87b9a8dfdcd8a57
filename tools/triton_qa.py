#!/usr/bin/env python3
"""Runs Triton's own QA suites and example clients, unchanged, against kiln.

    tools/triton_qa.py --triton TRITON_CHECKOUT --client TRITON_CLIENT_GIT_DIR --work DIR KILN_BIN SUITE...

TRITON_CHECKOUT is a checkout of triton-inference-server/server (its qa/ and
docs/ are read, never copied into kiln); TRITON_CLIENT_GIT_DIR a clone (bare
is fine) of triton-inference-server/client for the example clients. DIR gets
the generated models (Triton's qa/common/gen_qa_*.py, ONNX parts only, run
once), a model repository per suite, and out/<suite>.log and .server.log.
Each suite is set up as its qa/L0_*/test.sh sets it up, with kiln in place
of tritonserver on ports 8000/8001 (Python-backend identity models, which
kiln cannot run, become ONNX Identity models under the same config.pbtxt;
so do the identity backend's nop_* and custom_zero_1_float32 models that
Triton's ensembles use as steps).
SUITE: L0_infer L0_infer_ensemble L0_infer_zero L0_simple_ensemble L0_infer_shm L0_infer_variable L0_infer_reshape L0_string_io
L0_http L0_nullchar_string L0_input_validation L0_input_validation_names
L0_shared_memory_http L0_shared_memory_grpc examples examples_control
L0_sequence_batcher L0_implicit_state (their ONNX models; the sequence
batcher's tests run per model trial, 0 1 2 4 v, a server for each test as
test.sh runs them; SEQ_TESTS="test_a test_b" narrows them).
Prints "SUITE passed total" per suite (TRITON_QA_TESTS="Class.test ..." narrows
a suite to some tests). docs/development.md has the counts and what the
remaining failures are."""
import argparse, glob, os, shutil, signal, subprocess, sys, time, socket, re

PY = sys.executable
TQA = QA = GEN = OUT = CLIENT_GIT = ""


def cp(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)


def onnx_models(repo, pattern="onnx_*", drop_bf16=True):
    out = []
    for d in sorted(glob.glob(f"{GEN}/{repo}/{pattern}")):
        if drop_bf16 and "bf16" in d:
            continue
        out.append(d)
    return out


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


SIMPLE = """
import sys, onnx, onnx.helper as oh
from onnx import TensorProto as TP
md = sys.argv[1]
def save(name, nodes, t):
    vi = lambda n: oh.make_tensor_value_info(n, t, ["N", 16])
    g = oh.make_graph(nodes, name, [vi("INPUT0"), vi("INPUT1")], [vi("OUTPUT0"), vi("OUTPUT1")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]); m.ir_version = 8
    onnx.save(m, f"{md}/{name}/1/model.onnx")
save("simple", [oh.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                oh.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], TP.INT32)
save("simple_string", [oh.make_node("Cast", ["INPUT0"], ["a"], to=TP.INT32), oh.make_node("Cast", ["INPUT1"], ["b"], to=TP.INT32),
                       oh.make_node("Add", ["a", "b"], ["s"]), oh.make_node("Sub", ["a", "b"], ["d"]),
                       oh.make_node("Cast", ["s"], ["OUTPUT0"], to=TP.STRING),
                       oh.make_node("Cast", ["d"], ["OUTPUT1"], to=TP.STRING)], TP.STRING)
"""


def simple_models(md):
    """Triton's docs/examples models simple, simple_string (their config.pbtxt
    unchanged, ONNX files made here: Triton fetches its own) and
    simple_identity (a Python-backend model: an ONNX Identity in its place)."""
    for name in ("simple", "simple_string", "simple_identity"):
        os.makedirs(f"{md}/{name}/1", exist_ok=True)
        shutil.copy(f"{TQA}/docs/examples/model_repository/{name}/config.pbtxt", f"{md}/{name}/config.pbtxt")
    subprocess.run([PY, "-c", SIMPLE, md], check=True)
    p = f"{md}/simple_identity/config.pbtxt"
    open(p, "w").write(open(p).read().replace('backend: "python"', 'platform: "onnxruntime_onnx"'))
    # The python backend's identity takes any length: so does its ONNX stand-in.
    identity_onnx(f"{md}/simple_identity/1/model.onnx", ["N", "L"])


def identity_onnx(path, dims, tp="STRING"):
    subprocess.run([PY, "-c", f"""
import onnx, onnx.helper as oh
from onnx import TensorProto as TP
vi = lambda n: oh.make_tensor_value_info(n, TP.{tp}, {dims!r})
g = oh.make_graph([oh.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "g", [vi("INPUT0")], [vi("OUTPUT0")])
m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, {path!r})
"""], check=True)


NOP = """
import sys, onnx, onnx.helper as oh
from onnx import TensorProto as TP
path, tp, rank, two = sys.argv[1], getattr(TP, sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
names = [("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1")][:2 if two else 1]
vi = lambda n, d: oh.make_tensor_value_info(n, tp, d)
dims = [f"d{i}" for i in range(rank)]
g = oh.make_graph([oh.make_node("Identity", [i], [o]) for i, o in names], "nop",
                  [vi(i, dims) for i, _ in names], [vi(o, dims) for _, o in names])
m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, path)
"""

# The identity backend's data types, as ONNX element types.
NOP_TYPES = {"BOOL": "BOOL", "STRING": "STRING", "FP16": "FLOAT16", "FP32": "FLOAT", "FP64": "DOUBLE"}


def identity_backend_onnx(md, name, rank, two=True):
    """An identity-backend model (config.pbtxt there) as ONNX Identity nodes:
    the config says platform onnxruntime_onnx instead, the rest unchanged."""
    p = f"{md}/{name}/config.pbtxt"
    t = open(p).read().replace('backend: "identity"', 'platform: "onnxruntime_onnx"')
    open(p, "w").write(t)
    dt = re.search(r"data_type: TYPE_(\w+)", t).group(1)
    tp = NOP_TYPES.get(dt, dt)
    os.makedirs(f"{md}/{name}/1", exist_ok=True)
    subprocess.run([PY, "-c", NOP, f"{md}/{name}/1/model.onnx", tp, str(rank), "1" if two else "0"], check=True)


def ensemble_models(md, repo="qa_model_repository", pattern="*onnx*", hand_written=True):
    """What qa/L0_infer/test.sh adds with ENSEMBLES=1 and BACKENDS=onnx: the
    generated ensembles of ONNX models (repo's, named as pattern), the nop_*
    identity models they use as steps, and (hand_written) the ensembles of
    qa/ensemble_models and the custom_zero_1_float32 identity models those
    use."""
    ens = f"{GEN}/qa_ensemble_model_repository/{repo}"
    for d in sorted(glob.glob(f"{ens}/{pattern}")):
        if "bf16" not in d and not os.path.basename(d).startswith("nop_"):
            cp(d, f"{md}/{os.path.basename(d)}")
    for d in sorted(glob.glob(f"{ens}/nop_*")):
        n = os.path.basename(d)
        cp(d, f"{md}/{n}")
        # Batch dim first (max_batch_size 1024), then the config's dims.
        identity_backend_onnx(md, n, 1 + n.rsplit("_", 1)[1].count("-1"))
    if not hand_written:
        return
    for em in ("wrong_label_int32_float32_float32", "label_override_int32_float32_float32",
               "mix_type_int32_float32_float32", "batch_to_nobatch_float32_float32_float32",
               "batch_to_nobatch_nobatch_float32_float32_float32", "nobatch_to_batch_float32_float32_float32",
               "nobatch_to_batch_nobatch_float32_float32_float32", "mix_nobatch_batch_float32_float32_float32"):
        cp(f"{QA}/ensemble_models/{em}", f"{md}/{em}")
        os.makedirs(f"{md}/{em}/1", exist_ok=True)
    # test.sh's custom_zero_1_float32 (max_batch_size 8, dims [-1]) and
    # custom_nobatch_zero_1_float32 (no batching, dims [-1, -1]).
    for n, mbs, dims, rank in (("custom_zero_1_float32", 8, "[ -1 ]", 2),
                               ("custom_nobatch_zero_1_float32", 0, "[ -1, -1 ]", 2)):
        os.makedirs(f"{md}/{n}", exist_ok=True)
        t = open(f"{QA}/custom_models/custom_zero_1_float32/config.pbtxt").read()
        t = t.replace("custom_zero_1_float32", n).replace("max_batch_size: 1", f"max_batch_size: {mbs}")
        t = t.replace("dims: [ 1 ]", f"dims: {dims}") + "instance_group [ { kind: KIND_CPU }]\n"
        open(f"{md}/{n}/config.pbtxt", "w").write(t)
        identity_backend_onnx(md, n, rank, two=False)


def setup(suite, md):
    """Returns (cwd, test argv list, env, server flags)."""
    env = {}
    flags = []
    if suite in ("L0_infer", "L0_infer_shm", "L0_infer_ensemble"):
        for d in onnx_models("qa_model_repository"):
            cp(d, f"{md}/{os.path.basename(d)}")
            append(f"{md}/{os.path.basename(d)}/config.pbtxt", "instance_group [ { kind: KIND_CPU }]\n")
        env = {"BACKENDS": "onnx", "ENSEMBLES": "0"}
        if suite == "L0_infer_ensemble":
            ensemble_models(md)
            env["ENSEMBLES"] = "1"
        if suite == "L0_infer_shm":
            env["TEST_SYSTEM_SHARED_MEMORY"] = "1"
            flags = ["--allow-client-shm"]
        return "L0_infer", ["infer_test.py"], env, flags
    if suite == "L0_infer_variable":
        for d in onnx_models("qa_variable_model_repository"):
            cp(d, f"{md}/{os.path.basename(d)}")
            append(f"{md}/{os.path.basename(d)}/config.pbtxt", "instance_group [ { kind: KIND_CPU }]\n")
        env = {"BACKENDS": "onnx", "ENSEMBLES": "0"}
        return suite, ["infer_variable_test.py"], env, flags
    if suite == "L0_infer_reshape":
        for d in onnx_models("qa_reshape_model_repository"):
            cp(d, f"{md}/{os.path.basename(d)}")
        env = {"BACKENDS": "onnx", "ENSEMBLES": "0"}
        return suite, ["infer_reshape_test.py"], env, flags
    if suite == "L0_infer_zero":
        # Its test.sh: the identity models and the ensembles of nop_* identity steps.
        for d in onnx_models("qa_identity_model_repository"):
            cp(d, f"{md}/{os.path.basename(d)}")
        ensemble_models(md, "qa_identity_model_repository", "*", hand_written=False)
        env = {"BACKENDS": "onnx"}
        return suite, ["infer_zero_test.py"], env, flags
    if suite == "L0_simple_ensemble":
        # Its ensemble of four steps over two versions of `simple` (ONNX in
        # Triton too: the add/sub model made here); the tests of sequence
        # flags, partial outputs and backpressure need Python and decoupled
        # models.
        cp(f"{QA}/{suite}/models/ensemble_add_sub_int32_int32_int32", f"{md}/ensemble_add_sub_int32_int32_int32")
        os.makedirs(f"{md}/ensemble_add_sub_int32_int32_int32/1", exist_ok=True)
        simple_models(md)
        shutil.copy(f"{QA}/{suite}/models/simple/config.pbtxt", f"{md}/simple/config.pbtxt")
        cp(f"{md}/simple/1", f"{md}/simple/2")
        tests = ["test_ensemble_add_sub", "test_ensemble_add_sub_one_output"]
        return suite, ["ensemble_test.py"] + [f"EnsembleTest.{t}" for t in tests], env, flags
    if suite == "L0_string_io":
        cp(f"{GEN}/qa_identity_model_repository/onnx_zero_1_object", f"{md}/onnx_zero_1_object")
        # The python backend's string_identity model, as an ONNX Identity with the same config.
        os.makedirs(f"{md}/string_identity/1")
        t = open(f"{QA}/python_models/string_identity/config.pbtxt").read()
        t = t.replace('backend: "python"', 'platform: "onnxruntime_onnx"').replace("[ 1 ]", "[ 8 ]")
        open(f"{md}/string_identity/config.pbtxt", "w").write(t)
        identity_onnx(f"{md}/string_identity/1/model.onnx", [8])
        return suite, ["string_client_test.py"], env, flags
    if suite == "L0_http":
        for n in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16", "onnx_zero_3_float32"):
            cp(f"{GEN}/qa_identity_model_repository/{n}", f"{md}/{n}")
        cp(f"{md}/onnx_zero_1_object", f"{md}/onnx_zero_1_object_1_element")
        p = f"{md}/onnx_zero_1_object_1_element/config.pbtxt"
        t = open(p).read().replace("onnx_zero_1_object", "onnx_zero_1_object_1_element").replace("-1", "1", 1)
        open(p, "w").write(t)
        cp(f"{md}/onnx_zero_1_float32", f"{md}/onnx_zero_1_float32_queue")
        p = f"{md}/onnx_zero_1_float32_queue/config.pbtxt"
        t = open(p).read().replace("onnx_zero_1_float32", "onnx_zero_1_float32_queue")
        t += ("dynamic_batching { \n    max_queue_delay_microseconds: 1000000\n    preferred_batch_size: [ 8 ]\n"
              "    default_queue_policy {\n        max_queue_size: 1\n    }\n}\n")
        open(p, "w").write(t)
        simple_models(md)
        shutil.rmtree(f"{md}/simple"); shutil.rmtree(f"{md}/simple_string")
        cp(f"{md}/simple_identity", f"{md}/simple_identity_int64")
        p = f"{md}/simple_identity_int64/config.pbtxt"
        open(p, "w").write(open(p).read().replace("TYPE_STRING", "TYPE_INT64").replace("simple_identity", "simple_identity_int64"))
        # The python backend's identity takes any type; the ONNX stand-in is typed.
        identity_onnx(f"{md}/simple_identity_int64/1/model.onnx", ["N", "L"], "INT64")
        flags = ["--model-control-mode=explicit", "--load-model=*"]
        return suite, ["http_test.py"], env, flags
    if suite.startswith("L0_shared_memory"):
        simple_models(md)
        ctype = suite.rsplit("_", 1)[1]
        env = {"CLIENT_TYPE": ctype}
        flags = ["--allow-client-shm"]
        tests = ["test_invalid_create_shm", "test_valid_create_set_register", "test_unregister_before_register",
                 "test_unregister_after_register", "test_reregister_after_register", "test_unregister_after_inference",
                 "test_register_after_inference", "test_too_big_shm", "test_mixed_raw_shm", "test_unregisterall",
                 "test_infer_offset_out_of_bound", "test_infer_byte_size_out_of_bound", "test_infer_integer_overflow",
                 "test_register_out_of_bound", "test_register_reserved_names", "test_register_invalid_shm_key",
                 "test_python_client_leak"]
        return "L0_shared_memory", ["shared_memory_test.py"] + [f"SharedMemoryTest.{t}" for t in tests], env, flags
    if suite == "L0_nullchar_string":
        cp(f"{GEN}/qa_identity_model_repository/onnx_nobatch_zero_1_object", f"{md}/onnx_nobatch_zero_1_object")
        return suite, None, env, flags
    if suite == "L0_input_validation":
        cp(f"{GEN}/qa_model_repository/onnx_object_int32_int32", f"{md}/onnx_object_int32_int32")
        return suite, ["input_validation_test.py"], env, ["--allow-client-shm"]
    if suite == "L0_input_validation_names":
        return "L0_input_validation", ["input_validation_test.py", "ModelNameValidationTest"], env, \
            ["--model-control-mode=explicit"]
    if suite == "examples":
        simple_models(md)
        return None, None, env, ["--allow-client-shm"]
    if suite == "examples_control":
        # Triton's eight example folders (only the ONNX ones that kiln can make have model files).
        for d in sorted(glob.glob(f"{TQA}/docs/examples/model_repository/*")):
            n = os.path.basename(d)
            os.makedirs(f"{md}/{n}", exist_ok=True)
            shutil.copy(f"{d}/config.pbtxt", f"{md}/{n}/config.pbtxt")
        simple_models(md)
        return None, None, env, ["--model-control-mode=explicit"]
    raise SystemExit(f"unknown suite {suite}")


# L0_sequence_batcher's tests that need no scheduler delay (test.sh's
# NO_DELAY_TESTS); the others time Triton's TRITONSERVER_DELAY_SCHEDULER hook.
SEQ_NO_DELAY = ("test_simple_sequence test_length1_sequence test_batch_size test_no_sequence_start "
                "test_no_sequence_start2 test_no_sequence_end test_no_correlation_id")
# test.sh's model trials: (folder, max_batch_size, instances); 0 does not batch, v is variable-shape.
SEQ_TRIALS = (("0", 0, 4), ("1", 4, 1), ("2", 2, 2), ("4", 1, 4), ("v", 4, 1))


def seq_repos(work, implicit, initial):
    """(fixed, variable) repositories of Triton's generated sequence models."""
    if not implicit:
        return f"{GEN}/qa_sequence_model_repository", f"{GEN}/qa_variable_sequence_model_repository"
    if initial:
        return (f"{GEN}/qa_sequence_initial_state_implicit_model_repository",
                f"{GEN}/qa_variable_sequence_implicit_model_repository")
    return f"{GEN}/qa_sequence_implicit_model_repository", f"{GEN}/qa_variable_sequence_implicit_model_repository"


def seq_model(src, dst, batch, count):
    """A model folder as test.sh's sed lines make it: max_batch_size and the
    instance count set; KIND_GPU becomes KIND_CPU (kiln runs these on the CPU)."""
    cp(src, dst)
    p = f"{dst}/config.pbtxt"
    t = open(p).read().replace("KIND_GPU", "KIND_CPU")
    if batch:
        t = re.sub(r"(?m)^max_batch_size:.*", f"max_batch_size: {batch}", t)
    t = t.replace("kind: KIND_CPU", f"kind: KIND_CPU\ncount: {count}")
    open(p, "w").write(t)


def seq_setup(root, implicit, initial=False):
    """models0/1/2/4/v as L0_sequence_batcher's test.sh makes them (ONNX, no ensembles)."""
    fixed, var = seq_repos(root, implicit, initial)
    dtypes = ["object", "int32", "bool"] if implicit else ["int32", "bool"]
    for trial, batch, count in SEQ_TRIALS:
        md = f"{root}/models{trial}"
        os.makedirs(md, exist_ok=True)
        for dt in dtypes:
            name = f"onnx_{'nobatch_' if trial == '0' else ''}sequence_{dt}"
            src = f"{var if trial == 'v' else fixed}/{name}"
            if os.path.isdir(src):
                seq_model(src, f"{md}/{name}", batch, count)


def run_sequence(kiln, suite):
    """L0_sequence_batcher (explicit control models) or, for
    L0_implicit_state, its implicit_state.py on the ONNX models and then the
    sequence batcher's tests on the implicit-state models, as its test.sh
    does. Each test on a server of its own, per model trial."""
    implicit = suite == "L0_implicit_state"
    root = f"{os.path.dirname(OUT)}/run/{suite}"
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    seq_setup(root, implicit)
    ok = tot = 0
    txt = ""
    base = {"BACKENDS": "onnx", "ENSEMBLES": "0", "IMPLICIT_STATE": "1" if implicit else "0",
            "INITIAL_STATE_FILE": "0", "INITIAL_STATE_ZERO": "0", "USE_SINGLE_BUFFER": "0"}
    slog = open(f"{OUT}/{suite}.server.log", "w")
    if implicit:
        md = f"{root}/implicit_models"
        os.makedirs(md)
        src = f"{GEN}/qa_sequence_implicit_model_repository/onnx_nobatch_sequence_int32"
        seq_model(src, f"{md}/onnx_nobatch_sequence_int32", 0, 1)
        # "In order to allow the state to be returned, the model must describe
        # state as one of the outputs of the model" (test.sh).
        out = f"{md}/onnx_nobatch_sequence_int32_output"
        seq_model(src, out, 0, 1)
        t = open(f"{out}/config.pbtxt").read()
        t = re.sub(r'(?m)^name:.*', 'name: "onnx_nobatch_sequence_int32_output"', t)
        t += '\noutput [{ name: "OUTPUT_STATE" \n data_type: TYPE_INT32 \n dims: [ 1 ] }]\n'
        open(f"{out}/config.pbtxt", "w").write(t)
        o, n, out = one_test(kiln, md, [], slog, ["implicit_state.py"], f"{QA}/L0_implicit_state", base,
                             "implicit_state.py")
        ok += o; tot += n; txt += out
    tests = os.environ.get("SEQ_TESTS", SEQ_NO_DELAY).split()
    for trial, _, count in SEQ_TRIALS:
        env = dict(base, NO_BATCHING="1" if trial == "0" else "0", MODEL_INSTANCES=str(count),
                   BATCHER_TYPE="VARIABLE" if trial == "v" else "FIXED")
        for t in tests:
            o, n, out = one_test(kiln, f"{root}/models{trial}", [], slog,
                                 ["sequence_batcher_test.py", f"SequenceBatcherTest.{t}"], f"{QA}/L0_sequence_batcher",
                                 env, f"{t} models{trial}")
            ok += o; tot += n; txt += out
    open(f"{OUT}/{suite}.log", "w").write(txt)
    return suite, ok, tot, ""


def wait_port(port, proc, secs=60):
    t = time.time() + secs
    while time.time() < t:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            import urllib.request
            try:
                urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=1)
                return True
            except Exception:
                pass
        except OSError:
            pass
        time.sleep(0.2)
    return False


def unittest_counts(text):
    m = re.search(r"Ran (\d+) tests?", text)
    ran = int(m.group(1)) if m else 0
    m = re.search(r"FAILED \(([^)]*)\)", text)
    bad = 0
    if m:
        for part in m.group(1).split(","):
            k, _, v = part.strip().partition("=")
            if k in ("failures", "errors"):
                bad += int(v)
    return ran - bad, ran


def start(kiln, md, flags, log):
    """kiln serving md on 127.0.0.1:8000 (HTTP) and :8001 (gRPC), or None when it does not get ready."""
    proc = subprocess.Popen([kiln, "serve", f"--model-repository={md}", "--http-port=8000", "--grpc-port=8001",
                             "--http-address=127.0.0.1"] + flags, stdout=log, stderr=subprocess.STDOUT)
    if wait_port(8000, proc):
        return proc
    stop(proc)
    return None


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def suite_env(env):
    e = dict(os.environ, **env)
    e["PATH"] = os.path.dirname(PY) + ":" + e["PATH"]
    e["PYTHONPATH"] = f"{os.path.dirname(OUT)}/pylib"  # requests, psutil for the suites (pip install --target)
    return e


def run(kiln, suite):
    if suite in ("L0_sequence_batcher", "L0_implicit_state"):
        return run_sequence(kiln, suite)
    if suite.startswith("L0_shared_memory") or suite == "L0_simple_ensemble":
        return run_each(kiln, suite)
    return run_once(kiln, suite)


def one_test(kiln, md, flags, slog, argv, cwd, env, label):
    """A server on md for one run of argv (a unittest script and its
    arguments) in cwd: (passed, run, log text). A server that does not start
    counts as one failed test."""
    proc = start(kiln, md, flags, slog)
    if not proc:
        return 0, 1, f"{label}: server did not start\n"
    try:
        r = subprocess.run([PY] + argv, cwd=cwd, env=suite_env(env), capture_output=True, text=True, timeout=600)
        o, n = unittest_counts(r.stdout + r.stderr)
        return o, n, f"===== {label}\n" + r.stdout + r.stderr
    finally:
        stop(proc)


def run_each(kiln, suite):
    """As Triton's test.sh: a server of its own for each test."""
    md = f"{os.path.dirname(OUT)}/run/{suite}/models"
    shutil.rmtree(f"{os.path.dirname(OUT)}/run/{suite}", ignore_errors=True)
    os.makedirs(md)
    cwd, argv, env, flags = setup(suite, md)
    ok = tot = 0
    txt = ""
    for t in argv[1:]:
        o, n, out = one_test(kiln, md, flags, open(f"{OUT}/{suite}.server.log", "a"), [argv[0], t], f"{QA}/{cwd}",
                             env, t)
        ok += o; tot += n; txt += out
    open(f"{OUT}/{suite}.log", "w").write(txt)
    return suite, ok, tot, ""


def run_once(kiln, suite):
    os.makedirs(OUT, exist_ok=True)
    md = f"{os.path.dirname(OUT)}/run/{suite}/models"
    shutil.rmtree(f"{os.path.dirname(OUT)}/run/{suite}", ignore_errors=True)
    os.makedirs(md)
    cwd, argv, env, flags = setup(suite, md)
    slog = open(f"{OUT}/{suite}.server.log", "w")
    proc = start(kiln, md, flags, slog)
    if not proc:
        return suite, 0, 0, "server did not start"
    try:
        e = suite_env(env)
        if suite == "L0_nullchar_string":
            ok = tot = 0
            txt = ""
            for extra in ([], ["-i", "grpc", "-u", "localhost:8001"]):
                r = subprocess.run([PY, "nullchar_string_client.py", "-m", "onnx_nobatch_zero_1_object", "-v"] + extra,
                                   cwd=f"{QA}/{suite}", env=e, capture_output=True, text=True, timeout=300)
                tot += 1; ok += r.returncode == 0
                txt += r.stdout + r.stderr
            open(f"{OUT}/{suite}.log", "w").write(txt)
            return suite, ok, tot, ""
        if suite.startswith("examples"):
            return examples(e, control=suite == "examples_control")
        if os.environ.get("TRITON_QA_TESTS"):
            argv = argv[:1] + os.environ["TRITON_QA_TESTS"].split()
        r = subprocess.run([PY] + argv, cwd=f"{QA}/{cwd}", env=e, capture_output=True, text=True, timeout=1500)
        txt = r.stdout + r.stderr
        open(f"{OUT}/{suite}.log", "w").write(txt)
        ok, tot = unittest_counts(txt)
        return suite, ok, tot, ""
    finally:
        stop(proc)


def examples(e, control=False):
    G = f"git --git-dir={CLIENT_GIT}"
    names = subprocess.run(f"{G} ls-tree --name-only HEAD src/python/examples/", shell=True, capture_output=True,
                           text=True).stdout.split()
    d = f"{os.path.dirname(OUT)}/run/examples/src"
    os.makedirs(d, exist_ok=True)
    ok = tot = 0
    txt = ""
    for n in names:
        b = os.path.basename(n)
        if not b.startswith("simple_") or not b.endswith(".py"):
            continue
        if ("model_control" in b) != control:
            continue
        src = subprocess.run(f"{G} show HEAD:{n}", shell=True, capture_output=True, text=True).stdout
        open(f"{d}/{b}", "w").write(src)
        try:
            r = subprocess.run([PY, b], cwd=d, env=e, capture_output=True, text=True, timeout=120)
            rc = r.returncode
            out = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            rc, out = -1, "timeout"
        tot += 1; ok += rc == 0
        txt += f"===== {b}: rc={rc}\n{out[-1500:]}\n"
    name = "examples_control" if control else "examples"
    open(f"{OUT}/{name}.log", "w").write(txt)
    return name, ok, tot, ""


def generate(work):
    """Triton's generators, ONNX parts, as qa/common/gen_qa_model_repository runs them."""
    gens = [("gen_qa_models.py", ["--onnx"], "qa_model_repository"),
            ("gen_qa_models.py", ["--onnx", "--variable"], "qa_variable_model_repository"),
            ("gen_qa_identity_models.py", ["--onnx"], "qa_identity_model_repository"),
            ("gen_qa_reshape_models.py", ["--onnx", "--variable"], "qa_reshape_model_repository"),
            ("gen_qa_models.py", ["--ensemble"], "qa_ensemble_model_repository/qa_model_repository"),
            ("gen_qa_identity_models.py", ["--ensemble"], "qa_ensemble_model_repository/qa_identity_model_repository"),
            ("gen_qa_sequence_models.py", ["--onnx"], "qa_sequence_model_repository"),
            ("gen_qa_sequence_models.py", ["--onnx", "--variable"], "qa_variable_sequence_model_repository"),
            ("gen_qa_implicit_models.py", ["--onnx"], "qa_sequence_implicit_model_repository"),
            ("gen_qa_implicit_models.py", ["--onnx", "--variable"], "qa_variable_sequence_implicit_model_repository"),
            ("gen_qa_implicit_models.py", ["--onnx", "--initial-state", "zero"],
             "qa_sequence_initial_state_implicit_model_repository")]
    for script, args, out in gens:
        if not os.path.isdir(f"{work}/models/{out}"):
            subprocess.run([PY, script, *args, "--onnx_opset=0", f"--models_dir={work}/models/{out}"],
                           cwd=f"{QA}/common", check=True, stdout=subprocess.DEVNULL)
    if not os.path.isdir(f"{work}/pylib"):
        subprocess.run([PY, "-m", "pip", "install", "-q", "--target", f"{work}/pylib", "requests", "psutil"], check=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--triton", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("kiln")
    ap.add_argument("suites", nargs="+")
    a = ap.parse_args()
    TQA, QA, CLIENT_GIT = os.path.abspath(a.triton), os.path.abspath(a.triton) + "/qa", os.path.abspath(a.client)
    work = os.path.abspath(a.work)
    GEN, OUT = f"{work}/models", f"{work}/out"
    os.makedirs(OUT, exist_ok=True)
    generate(work)
    kiln = os.path.abspath(a.kiln)
    for s in a.suites:
        print(*run(kiln, s), flush=True)
