"""Triton's CUDA shared-memory extension end to end, with the official
tritonclient.http and tritonclient.grpc unchanged. On any machine: the
register requests refused before a device is touched (bodies that are not a
register request, handles that are not 64 bytes, a byte_size of 0, a name
that a system region already has), the refusal that names why when the
server has no usable GPU, the status and unregister answers, and that the
server keeps serving after each. On a machine with a GPU (and cuda-python for
tritonclient.utils.cuda_shared_memory): inputs and outputs of inference in
CUDA regions over both protocols, compared with onnxruntime, and the
status of registered regions."""
import base64
import uuid

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as sysshm
from tritonclient.utils import InferenceServerException

from conftest import build_repository, raw_request, serving, shm_clients

HANDLE = base64.b64encode(bytes(64))  # well formed; no process's allocation


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    yield from serving(build_repository(tmp_path_factory.mktemp("cudashmrepo")), "--allow-client-shm")


@pytest.fixture(params=["http", "grpc"])
def proto(request, srv):
    """(module, client) for each protocol; every region is unregistered after the test."""
    yield from shm_clients(request.param, srv, cuda=True)


def err_of(fn, *a, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*a, **kw)
    return e.value.message()


def cuda_status(mod, c, name=""):
    """The CUDA status as a list of (name, device_id, byte_size), for either client."""
    st = c.get_cuda_shared_memory_status(name)
    if mod is httpclient:
        return sorted((r["name"], int(r["device_id"]), int(r["byte_size"])) for r in st)
    return sorted((r.name, r.device_id, r.byte_size) for r in st.regions.values())


def x_input(mod, x, region=None):
    i = mod.InferInput("x", list(x.shape), "FP32")
    if region is None:
        i.set_data_from_numpy(x)
    else:
        i.set_shared_memory(region, x.nbytes)
    return i


def ort_run(repo, name, feeds):
    sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def still_serving(mod, c, srv):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    res = c.infer("tiny", [x_input(mod, x)])
    np.testing.assert_allclose(res.as_numpy("logits"), ort_run(srv.repo_path, "tiny", {"x": x})["logits"], rtol=1e-5,
                               atol=1e-5)


def server_gpu(c):
    """None when the server can register CUDA regions, else its reason (from a
    well-formed register that it refuses before opening the handle)."""
    try:
        c.register_cuda_shared_memory("probe_" + uuid.uuid4().hex[:8], HANDLE, 0, 16)
    except InferenceServerException as e:
        msg = e.message()
        return msg if "no usable GPU" in msg else None
    raise AssertionError("a handle of 64 zero bytes was registered")


# ---- on any machine ----------------------------------------------------------

def test_register_body_errors(srv):
    b = base64.b64encode(bytes(64)).decode()
    for body, want in [(b"", "must be a JSON object"), (b"[1]", "must be a JSON object"),
                       (b'{"device_id": 0, "byte_size": 4}', "no string 'raw_handle': {'b64'}"),
                       (b'{"raw_handle": "' + b.encode() + b'", "device_id": 0, "byte_size": 4}', "no string 'raw_handle'"),
                       (b'{"raw_handle": {"b64": "' + b.encode() + b'"}, "byte_size": 4}', "no integer 'device_id'"),
                       (b'{"raw_handle": {"b64": "' + b.encode() + b'"}, "device_id": -1, "byte_size": 4}',
                        "no integer 'device_id'"),
                       (b'{"raw_handle": {"b64": "' + b.encode() + b'"}, "device_id": 0}', "no integer 'byte_size'"),
                       (b'{"raw_handle": {"b64": "%%%"}, "device_id": 0, "byte_size": 4}',
                        "raw_handle.b64 is not the base64 of a 64-byte CUDA IPC handle")]:
        code, _, out = raw_request(srv.url, "POST", "/v2/cudasharedmemory/region/r/register", body)
        assert code == 400 and want in out.decode(), (body, code, out)
        assert "cuda shared memory region 'r'" in out.decode(), out
    code, _, _ = raw_request(srv.url, "GET", "/v2/cudasharedmemory/region/r/register")
    assert code == 405


def test_register_refusals(proto, srv):
    mod, c = proto
    msg = err_of(c.register_cuda_shared_memory, "short", base64.b64encode(bytes(32)), 0, 1024)
    assert "raw_handle is 32 bytes, but a CUDA IPC handle (cudaIpcMemHandle_t) is 64" in msg
    assert "byte_size must be more than 0" in err_of(c.register_cuda_shared_memory, "zero", HANDLE, 0, 0)
    # Names are unique across system and CUDA shared memory.
    tag = uuid.uuid4().hex[:12]
    h = sysshm.create_shared_memory_region(f"s{tag}", f"/kiln_test_{tag}", 64)
    try:
        c.register_system_shared_memory(f"s{tag}", f"/kiln_test_{tag}", 64)
        msg = err_of(c.register_cuda_shared_memory, f"s{tag}", HANDLE, 0, 64)
        assert f"shared memory region 's{tag}' already in manager" in msg
        c.unregister_cuda_shared_memory(f"s{tag}")  # a system region: left alone
        st = c.get_system_shared_memory_status(f"s{tag}")
        assert len(st if mod is httpclient else st.regions) == 1
    finally:
        c.unregister_system_shared_memory()
        sysshm.destroy_shared_memory_region(h)
    assert cuda_status(mod, c) == []
    still_serving(mod, c, srv)


def test_status_and_unregister_of_unknown(proto, srv):
    mod, c = proto
    assert cuda_status(mod, c) == []
    assert "Unable to find cuda shared memory region: 'nope'" in err_of(c.get_cuda_shared_memory_status, "nope")
    c.unregister_cuda_shared_memory("nope")  # not registered: not an error, as Triton
    c.unregister_cuda_shared_memory()
    still_serving(mod, c, srv)


def test_extension_listed_only_with_a_gpu(proto):
    mod, c = proto
    md = c.get_server_metadata()
    exts = md["extensions"] if mod is httpclient else list(md.extensions)
    assert ("cuda_shared_memory" in exts) == (server_gpu(c) is None), exts


def test_no_gpu_refusal(proto, srv):
    mod, c = proto
    why = server_gpu(c)
    if why is None:
        pytest.skip("the server has a usable GPU: the refusal without one cannot be seen here")
    assert "cannot be registered: this server has no usable GPU (" in why
    assert any(s in why for s in ("no NVIDIA driver", "sees no GPU", "is not installed", "cannot load")), why
    assert cuda_status(mod, c) == []
    still_serving(mod, c, srv)


def test_infer_naming_unregistered_cuda_region(proto, srv):
    mod, c = proto
    x = np.ones((2, 4), np.float32)
    msg = err_of(c.infer, "tiny", [x_input(mod, x, "gpu_region_never_registered")])
    assert "shared memory region 'gpu_region_never_registered' is not registered" in msg
    still_serving(mod, c, srv)


# ---- on a machine with a GPU ---------------------------------------------------

def cudashm_or_skip(c):
    """tritonclient.utils.cuda_shared_memory, or a skip saying what is missing."""
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
        from cuda.bindings import runtime as cudart
    except Exception as e:  # RuntimeError without cuda-python
        pytest.skip(f"tritonclient.utils.cuda_shared_memory is not usable here: {e}")
    err, n = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or n == 0:
        pytest.skip(f"no GPU usable by the client (cudaGetDeviceCount: {err}, {n} devices)")
    why = server_gpu(c)
    if why is not None:
        pytest.fail(f"the client sees {n} GPU(s) but the server refuses CUDA shared memory: {why}")
    return cudashm


def test_gpu_infer_inputs_and_outputs_in_cuda_shm(proto, srv):
    mod, c = proto
    cudashm = cudashm_or_skip(c)
    x = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)
    want = ort_run(srv.repo_path, "tiny", {"x": x})
    tag = uuid.uuid4().hex[:8]
    hin = cudashm.create_shared_memory_region(f"in{tag}", x.nbytes, 0)
    hout = cudashm.create_shared_memory_region(f"out{tag}", 64, 0)
    try:
        cudashm.set_shared_memory_region(hin, [x])
        c.register_cuda_shared_memory(f"in{tag}", cudashm.get_raw_handle(hin), 0, x.nbytes)
        c.register_cuda_shared_memory(f"out{tag}", cudashm.get_raw_handle(hout), 0, 64)
        assert cuda_status(mod, c) == sorted([(f"in{tag}", 0, x.nbytes), (f"out{tag}", 0, 64)])
        assert cuda_status(mod, c, f"out{tag}") == [(f"out{tag}", 0, 64)]
        assert "already in manager" in err_of(c.register_cuda_shared_memory, f"in{tag}",
                                              cudashm.get_raw_handle(hin), 0, x.nbytes)
        out = mod.InferRequestedOutput("logits")
        n = want["logits"].nbytes
        out.set_shared_memory(f"out{tag}", n)
        res = c.infer("tiny", [x_input(mod, x, f"in{tag}")], outputs=[out])
        got = cudashm.get_contents_as_numpy(hout, np.float32, list(want["logits"].shape))
        np.testing.assert_allclose(got, want["logits"], rtol=1e-5, atol=1e-5)
        # The input from the device, the outputs in the message.
        res = c.infer("tiny", [x_input(mod, x, f"in{tag}")])
        np.testing.assert_allclose(res.as_numpy("probs"), want["probs"], rtol=1e-5, atol=1e-6)
        # A range outside the region: a clear error, and the server keeps serving.
        big = mod.InferRequestedOutput("logits")
        big.set_shared_memory(f"out{tag}", n, 64 - 4)
        assert "outside shared memory region" in err_of(c.infer, "tiny", [x_input(mod, x)], outputs=[big])
        c.unregister_cuda_shared_memory(f"in{tag}")
        assert cuda_status(mod, c) == [(f"out{tag}", 0, 64)]
        c.unregister_cuda_shared_memory()
        assert cuda_status(mod, c) == []
        still_serving(mod, c, srv)
    finally:
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(hin)
        cudashm.destroy_shared_memory_region(hout)
