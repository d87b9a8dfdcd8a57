"""Error texts that Triton's clients, examples and QA suites compare (whole,
with startswith, or assertIn), over HTTP and gRPC through the real
tritonclient: an unknown model, an unknown version, a model with no version
loaded, a version not ready, inputs left out, an input whose bytes do not
match its shape (gRPC's raw_input_contents, and shared memory), and an
output asked twice. kiln's own detail, where it adds some, follows
Triton's words in parentheses."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import save_model, serving, strings_graph, tiny_graph, typed_graph


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("trepo")
    save_model(root, "tiny", tiny_graph())
    save_model(root, "typed", typed_graph())
    save_model(root, "idle", tiny_graph())
    save_model(root, "strings", strings_graph())
    yield from serving(root, "--model-control-mode", "explicit", "--load-model", "tiny", "--load-model", "typed",
                           "--load-model", "strings")


@pytest.fixture(params=["http", "grpc"])
def kind(request, srv):
    if request.param == "http":
        c = httpclient.InferenceServerClient(srv.url)
        yield httpclient, c
    else:
        c = grpcclient.InferenceServerClient(srv.grpc_url())
        yield grpcclient, c
    c.close()


def message(fn, *args, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value.message()


def x_input(mod, shape=(1, 4)):
    i = mod.InferInput("x", list(shape), "FP32")
    i.set_data_from_numpy(np.ones(shape, np.float32))
    return i


def test_unknown_model_and_version(kind):
    mod, c = kind
    msg = message(c.infer, "nope", [x_input(mod)])
    assert msg == "Request for unknown model: 'nope' is not found", msg
    msg = message(c.get_model_metadata, "nope")
    assert msg.startswith("Request for unknown model: 'nope' is not found"), msg
    msg = message(c.get_model_metadata, "tiny", model_version="99")
    assert msg.startswith("Request for unknown model: 'tiny' version 99 is not found"), msg
    msg = message(c.infer, "tiny", [x_input(mod)], model_version="99")
    assert msg.startswith("Request for unknown model: 'tiny' version 99 is not found"), msg
    # In the repository but never loaded: Triton's words, then how to load it.
    msg = message(c.infer, "idle", [x_input(mod)])
    assert msg.startswith("Request for unknown model: 'idle' is not found (its folder is in the repository"), msg


def test_no_available_versions(kind, srv):
    mod, c = kind
    c.load_model("idle")
    c.unload_model("idle")
    msg = message(c.infer, "idle", [x_input(mod)])
    assert msg.startswith("Request for unknown model: 'idle' has no available versions"), msg
    msg = message(c.infer, "idle", [x_input(mod)], model_version="1")
    assert msg.startswith("Request for unknown model: 'idle' version 1 is not at ready state"), msg


def test_missing_inputs(kind):
    mod, c = kind
    i = mod.InferInput("i", [2, 3], "INT64")
    i.set_data_from_numpy(np.zeros((2, 3), np.int64))
    msg = message(c.infer, "typed", [i])
    assert msg == ("expected 2 inputs but got 1 inputs for model 'typed'. Got input(s) ['i'], but missing required "
                   "input(s) ['flag']. Please provide all required input(s)."), msg


def test_no_inputs_grpc(srv):
    """tritonclient.grpc sends a request with no inputs as it is (HTTP's
    reader refuses an empty 'inputs' before the model is known)."""
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    msg = message(c.infer, "typed", [])
    assert msg == ("expected 2 inputs but got 0 inputs for model 'typed'. Got input(s) [], but missing required "
                   "input(s) ['i','flag']. Please provide all required input(s)."), msg
    c.close()


def test_output_twice(kind):
    mod, c = kind
    outs = [mod.InferRequestedOutput("probs"), mod.InferRequestedOutput("probs")]
    msg = message(c.infer, "tiny", [x_input(mod)], outputs=outs)
    assert msg.startswith("output 'probs' already exists in request"), msg


def test_input_byte_size_mismatch_grpc(srv):
    import grpc
    channel = grpc.insecure_channel(srv.grpc_url())
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = service_pb2.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    req.raw_input_contents.append(b"\0" * 40)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(
        "input byte size mismatch for input 'x' for model 'tiny'. Expected 32, got 40"), e.value.details()
    channel.close()


def test_string_element_count_grpc(srv):
    """BYTES in raw_input_contents holding more or fewer elements than the
    shape: Triton's two texts (for too many it names one past the shape's,
    where it stops reading)."""
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    for n, want in ((1, "expected 2 string elements for inference input 's' for model 'strings', got 1"),
                    (4, "unexpected number of string elements 3 for inference input 's' for model 'strings', "
                        "expecting 2")):
        i = grpcclient.InferInput("s", [1, n], "BYTES")
        i.set_data_from_numpy(np.array([[b"ab"] * n], dtype=object))
        i.set_shape([1, 2])
        msg = message(c.infer, "strings", [i])
        assert msg.startswith(want), msg
    c.close()


# ---- HTTP's own texts (L0_http's http_test.py compares these) --------------

@pytest.fixture(scope="module")
def hsrv(tmp_path_factory):
    """Models for the raw binary request's refusals: three inputs, two
    variable dims, a BYTES input of any length; and a BYTES identity."""
    import onnx.helper as oh
    from onnx import TensorProto as TP
    root = tmp_path_factory.mktemp("hrepo")

    def ident(name, ins, dtype, dims):
        vi = [oh.make_tensor_value_info(f"IN{k}", dtype, dims) for k in range(ins)]
        vo = [oh.make_tensor_value_info(f"OUT{k}", dtype, dims) for k in range(ins)]
        nodes = [oh.make_node("Identity", [f"IN{k}"], [f"OUT{k}"]) for k in range(ins)]
        save_model(root, name, oh.make_graph(nodes, name, vi, vo))

    ident("three", 3, TP.FLOAT, ["N", 8])
    ident("twovar", 1, TP.FLOAT16, ["N", "a", "b"])
    ident("text", 1, TP.STRING, ["N", "L"])
    ident("i64", 1, TP.INT64, ["N", 1])
    yield from serving(root)


def _post(srv, path, body, headers=None):
    import json
    from conftest import raw_request
    st, _, out = raw_request(srv.url, "POST", path, body, headers or {})
    return st, json.loads(out).get("error", "") if st != 200 else out


def test_raw_binary_refusals(hsrv):
    raw = {"Inference-Header-Content-Length": "0"}
    st, msg = _post(hsrv, "/v2/models/three/infer", np.zeros(24, np.float32).tobytes(), raw)
    assert st == 400 and msg.startswith(
        "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'three' model configuration"), msg
    st, msg = _post(hsrv, "/v2/models/twovar/infer", np.ones(4, np.float16).tobytes(), raw)
    assert st == 400 and msg.startswith("The shape of the raw input 'IN0' can not be deduced because there are more "
                                        "than one variable-sized dimension"), msg
    st, msg = _post(hsrv, "/v2/models/text/infer", b"427", raw)
    assert st == 400 and msg.startswith("For BYTE datatype raw input 'IN0', the model must have input shape [1]"), msg


def test_json_nesting_limit_is_tritons(hsrv):
    """Triton's limit (100) and words; data nested 50 deep is fine."""
    import json

    def nest(depth):
        v = "123"
        for _ in range(depth):
            v = f"[{v}]"
        return json.loads(v)

    body = json.dumps({"inputs": [{"name": "IN0", "datatype": "INT64", "shape": [1, 1], "data": nest(50)}]})
    st, out = _post(hsrv, "/v2/models/i64/infer", body.encode())
    assert st == 200 and json.loads(out)["outputs"][0]["data"] == [123], out
    body = json.dumps({"inputs": [{"name": "IN0", "datatype": "INT64", "shape": [1, 1], "data": nest(120)}]})
    st, msg = _post(hsrv, "/v2/models/i64/infer", body.encode())
    assert st == 400 and "JSON nesting depth exceeds maximum allowed limit (100)" in msg, msg


def test_shape_overflow_words(hsrv):
    import json
    for dims, words in (([16, 2**60 + 2], "causes total element count to exceed maximum size of"),
                        ([4, 2**60 + 2], "byte size overflow for input 'IN0'")):
        body = json.dumps({"inputs": [{"name": "IN0", "shape": dims, "datatype": "INT64", "data": [1]}]})
        st, msg = _post(hsrv, "/v2/models/i64/infer", body.encode())
        assert st == 400 and words in msg, (dims, msg)


def test_repository_index_ready_must_be_a_boolean(hsrv):
    st, msg = _post(hsrv, "/v2/repository/index", b'{"ready": "yes"}')
    assert st == 400 and msg == "Invalid value for 'ready': expected a boolean", msg
    st, out = _post(hsrv, "/v2/repository/index", b'{"ready": true}')
    assert st == 200


def test_model_names_a_load_may_not_use(srv):
    """Triton's model-name checks and words (L0_input_validation): empty or
    blank, and, for a load, a path out of the repository; an unload only
    looks the name up. A load that fails starts with 'failed to load'."""
    for mod, c in ((httpclient, httpclient.InferenceServerClient(srv.url)),
                   (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url()))):
        for name in ([""] if mod is grpcclient else []) + ["   ", "\t"]:
            assert "Model name cannot be empty. Please enter a valid name to deploy." in message(c.load_model, name)
        # Over HTTP a '/' is the path's own (the client does not encode it): 404.
        for name in [" ..", ".. "] + (["a/../b", "/etc/passwd"] if mod is grpcclient else []):
            assert "model name must not contain path traversal characters" in message(c.load_model, name), name
        for name in ("...", "..my_model", "model..1"):
            msg = message(c.load_model, name)
            assert msg.startswith(f"failed to load '{name}'") and "traversal" not in msg, msg
        assert "traversal" not in message(c.unload_model, "a/../b") if mod is grpcclient else True
        c.close()
