"""End-to-end fixtures: a temporary model repository and the real build/kiln
serving it on a free loopback port, reached with the official tritonclient.

The repository holds small ONNX models made here with onnx.helper (so every
result can be checked against onnxruntime) and, when present, the example
digits model from model_repository/.
"""
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP
from onnx import numpy_helper

# Every server the tests start (many at once) takes a free gRPC port, as
# --http-port 0 does for HTTP; test_grpc.py reads it from the log.
os.environ.setdefault("KILN_GRPC_PORT", "0")
# A test's server stops at once on SIGTERM, as before --shutdown-delay-secs;
# the tests of the delay (test_fleet.py, test_http_shutdown.py) set it.
os.environ.setdefault("KILN_SHUTDOWN_DELAY_SECS", "0")

# tritonclient.http runs on gevent, which gives every thread that uses it a
# hub holding two descriptors (its epoll and its wakeup) that outlive the
# thread: the 512-client batching test alone left 1024 open in this process,
# and later tests failed in select() or would run out of descriptors. Each
# thread frees its hub as it ends.
from gevent._hub_local import get_hub_if_exists  # noqa: E402 (tritonclient.http's own dependency)

_thread_run = threading.Thread.run


def _run_then_free_hub(self):
    try:
        _thread_run(self)
    finally:
        hub = get_hub_if_exists()
        if hub is not None:
            hub.destroy(destroy_loop=True)


threading.Thread.run = _run_then_free_hub

ROOT = Path(__file__).resolve().parents[2]
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build" / "kiln"))
DIGITS = ROOT / "model_repository" / "digits"


def kiln_run(model_path, feeds, out_names, tmp_path, extra=(), env=None, log=None):
    """Runs a model once through `kiln run` with feeds saved as .npy files;
    returns the outputs named out_names, read back from tmp_path. extra:
    more arguments; env: the environment; log: a list that gets stderr."""
    args = [str(KILN), "run", str(model_path), "--output-dir", str(tmp_path), "--quiet", *extra]
    for name, arr in feeds.items():
        f = tmp_path / f"in_{name}.npy"
        np.save(f, arr)
        args += ["--input", f"{name}={f}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    if log is not None:
        log.append(r.stderr)
    return [np.load(tmp_path / (n.replace("/", "_") + ".npy"), allow_pickle=False) for n in out_names]


def onnx_reference(model, feeds, names=None):
    """ONNX's reference evaluator on model (outputs names, default all).
    It implements DequantizeLinear from opset 19 only; the ops of the
    quantized models tested here mean the same at opset 17 and 21."""
    from onnx.reference import ReferenceEvaluator
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, 21)
    return ReferenceEvaluator(m).run(names, feeds)


# Where an integer product's activation, its zero point, the weight and its
# zero point sit among a node's inputs (activation None: quantized inside
# the node from floats, always to uint8).
_INT8_PRODUCTS = {
    ("", "MatMulInteger"): (0, 2, 1, 3), ("", "ConvInteger"): (0, 2, 1, 3),
    ("", "QLinearMatMul"): (0, 2, 3, 5), ("", "QLinearConv"): (0, 2, 3, 5),
    ("com.microsoft", "QGemm"): (0, 2, 3, 5), ("com.microsoft", "MatMulIntegerToFloat"): (0, 4, 1, 5),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, None, 1, 3),
    ("com.microsoft", "DynamicQuantizeLSTM"): (None, None, 1, 9),
}
_INT8_PRODUCTS_MORE = {("com.microsoft", "DynamicQuantizeLSTM"): (2, 11)}  # R and its zero point


def ort_exact_int8(model):
    """model with each product of uint8 activations and constant int8
    weights written as the same product of uint8 weights: weights and zero
    points plus 128 (w - zp is unchanged, so are the sums). onnxruntime
    multiplies uint8 by int8 with vpmaddubsw on CPUs without VNNI, whose
    int16 pair sums saturate (the quantizers' reduce_range exists for it),
    so on an AVX2-only CPU its answers drift from the operators'
    definitions; its uint8 x uint8 product is exact on every CPU. The
    reference for kiln's exact integer products, which must equal the
    definition on every CPU."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    dtypes = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.value_info):
        dtypes.setdefault(vi.name, vi.type.tensor_type.elem_type)
    for n in g.node:
        if n.op_type in ("DynamicQuantizeLinear", "QuantizeLinear"):
            for o in n.output[:1]:
                zp = n.input[2] if n.op_type == "QuantizeLinear" and len(n.input) > 2 else ""
                dtypes[o] = dtypes.get(zp, onnx.TensorProto.UINT8)
    fresh = 0
    for n in g.node:
        spec = _INT8_PRODUCTS.get((n.domain if n.domain != "ai.onnx" else "", n.op_type))
        if not spec:
            continue
        act, act_zp = spec[:2]
        if act is not None:
            zp = n.input[act_zp] if act_zp < len(n.input) else ""
            if dtypes.get(zp if zp else n.input[act]) != onnx.TensorProto.UINT8:
                continue
        pairs = [spec[2:]] + ([_INT8_PRODUCTS_MORE[(n.domain, n.op_type)]]
                              if (n.domain, n.op_type) in _INT8_PRODUCTS_MORE else [])
        for wi, zi in pairs:
            w = inits.get(n.input[wi]) if wi < len(n.input) else None
            if w is None or w.data_type != onnx.TensorProto.INT8:
                continue
            wv = numpy_helper.to_array(w).astype(np.int16) + 128
            z = inits.get(n.input[zi]) if zi < len(n.input) and n.input[zi] else None
            if z is not None:
                zv = numpy_helper.to_array(z).astype(np.int16) + 128
            else:  # absent: 0, in the shape of the scale beside it
                sv = inits.get(n.input[zi - 1])
                zv = np.full(numpy_helper.to_array(sv).shape if sv is not None else (), 128, np.int16)
            fresh += 1
            for idx, v in ((wi, wv), (zi, zv)):
                t = numpy_helper.from_array(v.astype(np.uint8), f"{n.input[wi]}_as_uint8_{fresh}_{idx}")
                g.initializer.append(t)
                while len(n.input) <= idx:
                    n.input.append("")
                n.input[idx] = t.name
    return m


def save_model(root, name, graph, version=1, config=None, opset=17):
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    d = Path(root) / name / str(version)
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "model.onnx"))
    if config is not None:
        (Path(root) / name / "config.json").write_text(config)
    return d / "model.onnx"


def no_batch_config(graph, **extra):
    """config.json (a dict) saying a model does not batch, as Triton reads
    it: max_batch_size absent, every input and output listed with its whole
    shape (-1 for a symbolic dim). graph: a GraphProto, ModelProto or path."""
    if not isinstance(graph, onnx.GraphProto):
        graph = (graph if isinstance(graph, onnx.ModelProto) else onnx.load(str(graph))).graph
    consts = {t.name for t in graph.initializer}

    def listed(vis):
        out = []
        for v in vis:
            if v.name in consts:
                continue
            e = {"name": v.name}
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
                e["dims"] = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            out.append(e)
        return out
    return {"input": listed(graph.input), "output": listed(graph.output), **extra}


def tiny_graph(seed=0):
    """x[N,4] -> logits = x W + B, probs = softmax(logits): batchable, two outputs."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    return oh.make_graph(
        [oh.make_node("MatMul", ["x", "W"], ["mm"]), oh.make_node("Add", ["mm", "B"], ["logits"]),
         oh.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "tiny",
        [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
        [oh.make_tensor_value_info("probs", TP.FLOAT, ["N", 3]),
         oh.make_tensor_value_info("logits", TP.FLOAT, ["N", 3])],
        [oh.make_tensor("W", TP.FLOAT, w.shape, w.flatten()), oh.make_tensor("B", TP.FLOAT, b.shape, b)])


def typed_graph():
    """Integer and boolean inputs, fixed shape (no batching): a = i64 + 1, b = not(flag)."""
    one = oh.make_tensor("one", TP.INT64, [], [1])
    return oh.make_graph(
        [oh.make_node("Add", ["i", "one"], ["a"]), oh.make_node("Not", ["flag"], ["b"])],
        "typed",
        [oh.make_tensor_value_info("i", TP.INT64, [2, 3]), oh.make_tensor_value_info("flag", TP.BOOL, [2, 3])],
        [oh.make_tensor_value_info("a", TP.INT64, [2, 3]), oh.make_tensor_value_info("b", TP.BOOL, [2, 3])],
        [one])


def strings_graph():
    return oh.make_graph(
        [oh.make_node("Identity", ["s"], ["out"])], "strings",
        [oh.make_tensor_value_info("s", TP.STRING, ["N", 2])],
        [oh.make_tensor_value_info("out", TP.STRING, ["N", 2])])


def slow_graph(depth=60, width=512):
    """A chain of MatMuls: each request takes milliseconds, so requests queue."""
    w = (np.random.default_rng(1).standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes, prev = [], "x"
    for i in range(depth):
        nodes.append(oh.make_node("MatMul", [prev, "W"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(oh.make_node("Identity", [prev], ["y"]))
    return oh.make_graph(nodes, "slow", [oh.make_tensor_value_info("x", TP.FLOAT, [1, width])],
                         [oh.make_tensor_value_info("y", TP.FLOAT, [1, width])],
                         [oh.make_tensor("W", TP.FLOAT, w.shape, w.flatten())])


def build_repository(root):
    root = Path(root)
    save_model(root, "tiny", tiny_graph())
    save_model(root, "typed", typed_graph())
    save_model(root, "strings", strings_graph())
    save_model(root, "slow", slow_graph())
    # Classification labels from the config's label_filename.
    save_model(root, "labeled", tiny_graph(), config='{"output": [{"name": "probs", "label_filename": "labels.txt"}]}')
    (root / "labeled" / "labels.txt").write_text("cat\ndog\nbird\n")
    # Two versions, both served by policy.
    save_model(root, "multi", tiny_graph(0), version=1, config='{"version_policy": {"all": {}}}')
    save_model(root, "multi", tiny_graph(1), version=2)
    if DIGITS.exists():
        shutil.copytree(DIGITS, root / "digits")
    return root


class KilnServer:
    """build/kiln serve on 127.0.0.1 with --http-port 0; the port is read from its log."""

    def __init__(self, repo, *args, env=None, log_path=None, wait_ready=True):
        assert KILN.exists(), f"{KILN} is missing: run make first"
        self.repo = Path(repo)
        self.log_path = Path(log_path or (self.repo.parent / f"kiln-{time.monotonic_ns()}.log"))
        self.log = open(self.log_path, "w+")
        cmd = [str(KILN), "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
               "--http-port", "0", "--http-threads", "2", *args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        self.port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.log_path.read_text())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"kiln did not start:\n{self.log_path.read_text()}")
        self.url = f"127.0.0.1:{self.port}"

    def text(self):
        return self.log_path.read_text()

    def grpc_url(self, timeout=30):
        """host:port of the gRPC front end, read from the log (it starts after HTTP)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"listening on grpc://([^:\s]+):(\d+)", self.text())
            if m:
                return f"{m.group(1)}:{m.group(2)}"
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"kiln serves no gRPC:\n{self.text()}")

    def sanitizer_report(self):
        """The first sanitizer finding in the log (ASan, UBSan, LSan builds), or None."""
        text = self.text()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer"):
            i = text.find(marker)
            if i >= 0:
                return text[max(0, i - 200):i + 3000]
        return None

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def repo(tmp_path_factory):
    return build_repository(tmp_path_factory.mktemp("repo"))


def serving(repo, *args):
    """For a fixture: a KilnServer on repo (repo_path set), then its stop,
    checked for a sanitizer report and a clean exit."""
    s = KilnServer(repo, *args)
    s.repo_path = repo
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, f"kiln exited with {rc}:\n{s.text()}"


def shm_clients(kind, srv, cuda=False):
    """For a fixture: (module, client) of tritonclient's http or grpc on srv;
    afterwards every system (and with cuda, CUDA) shared-memory region is
    unregistered and the client closed."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    if kind == "http":
        mod, c = httpclient, httpclient.InferenceServerClient(srv.url)
    else:
        mod, c = grpcclient, grpcclient.InferenceServerClient(srv.grpc_url())
    yield mod, c
    if cuda:
        c.unregister_cuda_shared_memory()
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture()
def regions():
    """Creates shared-memory objects (tritonclient.utils.shared_memory) with
    unique keys, prefix + a random tag; destroys them after the test."""
    import tritonclient.utils.shared_memory as shm
    made = []

    def make(size, name=None, prefix="/kiln_test_"):
        tag = uuid.uuid4().hex[:12]
        h = shm.create_shared_memory_region(name or f"r{tag}", f"{prefix}{tag}", size)
        made.append(h)
        return h

    yield make
    for h in made:
        shm.destroy_shared_memory_region(h)


@pytest.fixture(scope="session")
def server(repo):
    yield from serving(repo)


@pytest.fixture()
def client(server):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture()
def small_repo(tmp_path):
    """tiny and typed, for the tests that load and unload."""
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    save_model(root, "typed", typed_graph())
    return root


@pytest.fixture()
def make_server(tmp_path):
    """Starts extra servers for one test and stops them after it."""
    started = []

    def make(repo, *args, **kw):
        s = KilnServer(repo, *args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
    for s in started:
        assert s.sanitizer_report() is None, s.sanitizer_report()


def raw_request(url, method, path, body=None, headers=None):
    """One HTTP request without the client library: (status, headers, body bytes)."""
    import http.client
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()



def run_concurrently(*fns):
    """Runs each callable on a thread of its own, all at once, and fails
    with every exception they raised (pytest's failures included)."""
    errors, lock = [], threading.Lock()

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            with lock:
                errors.append(e)

    ts = [threading.Thread(target=guarded, args=(fn,)) for fn in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors

def reload_under_traffic(root, model, load, open_client, infer, close_client, nthreads=6):
    """Inference on `model` from nthreads clients (open_client(i) makes
    thread i's, infer(c) answers the model version that served it) while
    load() reloads it five times in place, then once more after version 2
    was added to the repository. Returns (answers, failures, versions)."""
    import threading
    stop = threading.Event()
    results = {"ok": 0, "fail": [], "versions": set()}
    lock = threading.Lock()

    def traffic(i):
        c = open_client(i)
        while not stop.is_set():
            try:
                v = infer(c)
                with lock:
                    results["ok"] += 1
                    results["versions"].add(v)
            except Exception as e:  # noqa: BLE001 - any failure is the test's failure
                with lock:
                    results["fail"].append(repr(e))
        close_client(c)

    threads = [threading.Thread(target=traffic, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        for _ in range(5):
            load()  # reload in place
            time.sleep(0.1)
        # A new version appears: a reload swaps to it, in-flight requests finish on the old one.
        save_model(root, model, tiny_graph(1), version=2)
        load()
        time.sleep(0.3)
        before = results["ok"]
        time.sleep(0.3)
        assert results["ok"] > before, "no answers after the last reload"
    finally:
        stop.set()
        for t in threads:
            t.join()
    return results["ok"], results["fail"], results["versions"]
