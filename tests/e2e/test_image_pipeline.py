"""Images in, labels out: an ensemble taking a JPEG's bytes (UINT8) through a
preprocessing graph (ImageDecoder -> Resize -> scale and normalise ->
NCHW) and a small CNN classifier to its top-k labels, over HTTP and gRPC
with tritonclient's classification extension. The answer is held to the
same two graphs run by onnx's reference implementation (which decodes with
Pillow); a broken image is a 400 naming the step's model and the decoder's
input, and the server serves on."""
import io

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP
from onnx import numpy_helper as nh

from conftest import save_model, serving

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

SIZE = 32
LABELS = [f"class_{i}" for i in range(10)]


def preprocess_graph():
    """JPEG bytes [n] -> float [1, 3, 32, 32]: RGB, bilinear resize, /255, ImageNet mean and std."""
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3)
    nodes = [
        oh.make_node("ImageDecoder", ["IMAGE"], ["hwc"], pixel_format="RGB"),
        oh.make_node("Cast", ["hwc"], ["hwc_f"], to=TP.FLOAT),
        oh.make_node("Resize", ["hwc_f", "", "", "sizes"], ["small"], mode="linear", axes=[0, 1]),
        oh.make_node("Div", ["small", "c255"], ["unit"]),
        oh.make_node("Sub", ["unit", "mean"], ["centred"]),
        oh.make_node("Div", ["centred", "std"], ["norm"]),
        oh.make_node("Transpose", ["norm"], ["chw"], perm=[2, 0, 1]),
        oh.make_node("Unsqueeze", ["chw", "ax0"], ["PIXELS"]),
    ]
    inits = [nh.from_array(np.array([SIZE, SIZE], np.int64), "sizes"), nh.from_array(np.array(255, np.float32), "c255"),
             nh.from_array(mean, "mean"), nh.from_array(std, "std"), nh.from_array(np.array([0], np.int64), "ax0")]
    return oh.make_graph(nodes, "preprocess", [oh.make_tensor_value_info("IMAGE", TP.UINT8, [None])],
                         [oh.make_tensor_value_info("PIXELS", TP.FLOAT, [1, 3, SIZE, SIZE])], inits)


def classifier_graph():
    """[1, 3, 32, 32] -> softmax over 10 classes: conv, relu, global pool, dense (seeded weights)."""
    r = np.random.default_rng(11)
    w = r.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32)
    b = r.normal(0, 0.1, 16).astype(np.float32)
    fw = r.normal(0, 0.5, (16, 10)).astype(np.float32)
    fb = r.normal(0, 0.1, 10).astype(np.float32)
    nodes = [
        oh.make_node("Conv", ["PIXELS", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("GlobalAveragePool", ["r"], ["g"]),
        oh.make_node("Flatten", ["g"], ["f"]),
        oh.make_node("Gemm", ["f", "fw", "fb"], ["logits"]),
        oh.make_node("Softmax", ["logits"], ["PROBS"], axis=1),
    ]
    inits = [nh.from_array(w, "w"), nh.from_array(b, "b"), nh.from_array(fw, "fw"), nh.from_array(fb, "fb")]
    return oh.make_graph(nodes, "classifier", [oh.make_tensor_value_info("PIXELS", TP.FLOAT, [1, 3, SIZE, SIZE])],
                         [oh.make_tensor_value_info("PROBS", TP.FLOAT, [1, 10])], inits)


ENSEMBLE = """name: "image_classifier"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ 1, 10 ] label_filename: "labels.txt" } ]
ensemble_scheduling {
  step [
    { model_name: "preprocess" model_version: -1
      input_map { key: "IMAGE" value: "IMAGE" } output_map { key: "PIXELS" value: "pixels" } },
    { model_name: "classifier" model_version: -1
      input_map { key: "PIXELS" value: "pixels" } output_map { key: "PROBS" value: "PROBS" } }
  ]
}
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgpipe")
    save_model(root, "preprocess", preprocess_graph(), opset=20,
               config='{"max_batch_size": 0, "input": [{"name": "IMAGE", "data_type": "TYPE_UINT8", "dims": [-1]}]}')
    save_model(root, "classifier", classifier_graph(), config='{"max_batch_size": 0}')
    (root / "image_classifier" / "1").mkdir(parents=True)
    (root / "image_classifier" / "config.pbtxt").write_text(ENSEMBLE)
    (root / "image_classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    yield from serving(root)


def jpeg(seed, w=61, h=47):
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 4 + r.integers(0, 30, (h, w)), y * 5 + r.integers(0, 30, (h, w)),
                    (x + y) * 2 + r.integers(0, 30, (h, w))], -1).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return np.frombuffer(buf.getvalue(), np.uint8)


def reference(data):
    from onnx.reference import ReferenceEvaluator

    def model(g, opset):
        return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    pixels = ReferenceEvaluator(model(preprocess_graph(), 20)).run(None, {"IMAGE": data})[0]
    return ReferenceEvaluator(model(classifier_graph(), 17)).run(None, {"PIXELS": pixels})[0][0]


def top_k(probs, k):
    order = np.argsort(-probs, kind="stable")[:k]
    return [(float(probs[i]), LABELS[i]) for i in order]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_jpeg_to_top_k_labels(srv, proto):
    if proto == "http":
        import tritonclient.http as client
        c = client.InferenceServerClient(srv.url)
    else:
        import tritonclient.grpc as client
        c = client.InferenceServerClient(srv.grpc_url())
    for seed in range(4):
        data = jpeg(seed)
        x = client.InferInput("IMAGE", [len(data)], "UINT8")
        x.set_data_from_numpy(data)
        r = c.infer("image_classifier", [x], outputs=[client.InferRequestedOutput("PROBS", class_count=3)])
        got = [e.decode() if isinstance(e, bytes) else e for e in r.as_numpy("PROBS").reshape(-1)]
        want = top_k(reference(data), 3)
        assert len(got) == 3
        for entry, (p, label) in zip(got, want):
            value, index, name = entry.split(":")
            assert name == label and abs(float(value) - p) < 1e-4, (got, want)
    # The probabilities themselves, every class.
    data = jpeg(9)
    x = client.InferInput("IMAGE", [len(data)], "UINT8")
    x.set_data_from_numpy(data)
    probs = c.infer("image_classifier", [x]).as_numpy("PROBS").reshape(-1)
    assert np.allclose(probs, reference(data), atol=1e-5)
    c.close()


def test_broken_image_is_a_400_naming_the_step_and_input(srv):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    c = httpclient.InferenceServerClient(srv.url)
    good = jpeg(1)
    for bad in (good[: len(good) // 3], np.frombuffer(b"not an image at all", np.uint8)):
        x = httpclient.InferInput("IMAGE", [len(bad)], "UINT8")
        x.set_data_from_numpy(bad)
        with pytest.raises(InferenceServerException) as e:
            c.infer("image_classifier", [x])
        msg = e.value.message()
        # The step's model and the decoder's input are named.
        assert e.value.status() == "400" and "'preprocess'" in msg and "input 'IMAGE'" in msg, msg
    x = httpclient.InferInput("IMAGE", [len(good)], "UINT8")
    x.set_data_from_numpy(good)
    assert c.infer("image_classifier", [x]).as_numpy("PROBS").shape == (1, 10)
    c.close()


def png_chunk(kind, data, crc=None):
    import struct
    import zlib
    c = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", c & 0xFFFFFFFF)


def hostile_images():
    """(what, bytes, words the 400 must hold)."""
    import struct
    sig = b"\x89PNG\r\n\x1a\n"
    huge = sig + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) + png_chunk(b"IEND", b"")
    buf = io.BytesIO()
    Image.fromarray(np.full((9, 13, 3), 77, np.uint8)).save(buf, format="PNG")
    png = bytearray(buf.getvalue())
    bad_crc = bytes(png[:29]) + bytes([png[29] ^ 0xFF]) + bytes(png[30:])  # IHDR's CRC is bytes 29..32
    gif = io.BytesIO()
    Image.fromarray(np.full((9, 13, 3), 77, np.uint8)).save(gif, format="GIF")
    cases = [("zero bytes", b"", ["not a JPEG, PNG, WebP or BMP image (0 bytes)"]),
             ("100000 x 100000 PNG", huge, ["100000 x 100000", "each side 1 to 65535"]),
             ("PNG with a bad CRC", bad_crc, ["broken PNG", "CRC"]),
             ("GIF", gif.getvalue(), ["not a JPEG, PNG, WebP or BMP", "47 49 46 38"])]
    if "WEBP" in Image.SAVE:
        webp = io.BytesIO()
        Image.fromarray(np.full((40, 50, 3), 120, np.uint8)).save(webp, format="WEBP")
        cases.append(("truncated WebP", webp.getvalue()[: len(webp.getvalue()) // 2], ["WebP"]))
        cases.append(("WebP header alone", webp.getvalue()[:12], ["broken WebP"]))
    return cases


@pytest.mark.parametrize("model", ["preprocess", "image_classifier"])
def test_hostile_images_are_400s_naming_the_request_input(srv, model):
    """Zero bytes, a header claiming 100000 x 100000 pixels, a PNG whose CRC
    is wrong, a GIF, a truncated WebP: each a 400 naming the request's
    input (IMAGE, not the operator's parameter name) and what is wrong with
    the bytes, sent to the model itself and through the ensemble; the
    server decodes the next good image."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    c = httpclient.InferenceServerClient(srv.url)
    for what, data, words in hostile_images():
        arr = np.frombuffer(data, np.uint8)
        x = httpclient.InferInput("IMAGE", [len(arr)], "UINT8")
        x.set_data_from_numpy(arr)
        with pytest.raises(InferenceServerException) as e:
            c.infer(model, [x])
        msg = e.value.message()
        assert e.value.status() == "400", (what, msg)
        assert "input 'IMAGE'" in msg and "encoded_stream" not in msg, (what, msg)
        for w in words:
            assert w in msg, (what, msg)
    x = httpclient.InferInput("IMAGE", [len(jpeg(3))], "UINT8")
    x.set_data_from_numpy(jpeg(3))
    assert c.infer("image_classifier", [x]).as_numpy("PROBS").shape == (1, 10)
    c.close()
