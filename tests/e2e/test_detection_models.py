"""torchvision's SSDlite 320 (MobileNetV3-Large backbone) served by the real
binary over HTTP, against onnxruntime.

The model is torch.onnx's export of the network and its box decoding, made
by tests/models/make_detection_models.py and kept in tests/data/detection/:
images [N,3,320,320] -> the heads (bbox_regression, cls_logits) and every
anchor's decoded, clipped box and class scores. The export's own
postprocessing (thresholds, top-k, NMS) has shapes that depend on the scores
and is not part of it. The test checks the four outputs on seeded images,
batches of one and three, then the detections a client makes of them (the
best class and its score per anchor, the highest-scoring anchors): the same
labels and boxes as from onnxruntime's outputs. Concurrent single images
are batched by the dynamic batcher and each gets its own answer. Bad
requests get a 400 naming what was wrong, and the server keeps serving.

The full export (make_detection_models.py --full, ssdlite_full.onnx) has
the postprocessing too: images [1,3,320,320] -> boxes [D,4], scores [D],
labels [D], D the detections kept. Per class a score threshold (NonZero,
GatherND) and a TopK of at most 300 candidates, the 90 classes' results
concatenated, an If on whether any box is left, and batched NMS: shapes
that follow the scores, which no plan per input shape holds, so the model
runs node by node (models/valrun.h). Its detections must be onnxruntime's,
box for box, for single and concurrent requests, and bad requests get a
400 while the server keeps serving."""
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import raw_request

ROOT = Path(__file__).resolve().parents[2]
SSD = ROOT / "tests" / "data" / "detection" / "ssdlite_heads.onnx"
FULL = ROOT / "tests" / "data" / "detection" / "ssdlite_full.onnx"
OUTPUTS = ("bbox_regression", "cls_logits", "boxes", "scores")
TOL = {"bbox_regression": (1e-4, 1e-4), "cls_logits": (1e-4, 1e-4), "boxes": (1e-4, 2e-3), "scores": (1e-4, 1e-6)}


@pytest.fixture(scope="module")
def ssd_server(tmp_path_factory):
    from conftest import KilnServer
    repo = tmp_path_factory.mktemp("detection") / "repo"
    (repo / "ssdlite" / "1").mkdir(parents=True)
    shutil.copy(SSD, repo / "ssdlite" / "1" / "model.onnx")
    (repo / "ssdlite_full" / "1").mkdir(parents=True)
    shutil.copy(FULL, repo / "ssdlite_full" / "1" / "model.onnx")
    (repo / "ssdlite_batch" / "1").mkdir(parents=True)
    shutil.copy(SSD, repo / "ssdlite_batch" / "1" / "model.onnx")
    (repo / "ssdlite_batch" / "config.json").write_text(json.dumps({
        "max_batch_size": 8, "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 50000}}))
    s = KilnServer(repo)
    yield s
    s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()


@pytest.fixture(scope="module")
def ort_session():
    return ort.InferenceSession(str(SSD), providers=["CPUExecutionProvider"])


def images(seed, n):
    """A smooth background with bright rectangles: something for the
    boxes to find, different per seed."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 0.3, size=(n, 3, 320, 320)).astype(np.float32)
    for b in range(n):
        for _ in range(3):
            y0, x0 = rng.integers(0, 240, size=2)
            h, w = rng.integers(30, 80, size=2)
            x[b, :, y0:y0 + h, x0:x0 + w] = rng.uniform(0.5, 1.0, size=(3, 1, 1))
    return x


def infer(client, x, model="ssdlite", outputs=OUTPUTS):
    i = httpclient.InferInput("images", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=True)
    r = client.infer(model, [i], outputs=[httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs])
    return {n: r.as_numpy(n) for n in outputs}


def detections(boxes, scores, k=20):
    """Per image: the k anchors whose best non-background class scores
    highest, with that class and its box (as SSD's postprocessing ranks
    candidates before NMS)."""
    fg = scores[..., 1:]
    labels = fg.argmax(-1) + 1
    best = fg.max(-1)
    out = []
    for b in range(boxes.shape[0]):
        top = np.argsort(-best[b], kind="stable")[:k]
        out.append((top, labels[b, top], best[b, top], boxes[b, top]))
    return out


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 3), (2, 1)])
def test_ssdlite_matches_onnxruntime(ssd_server, ort_session, seed, n):
    client = httpclient.InferenceServerClient(ssd_server.url)
    x = images(seed, n)
    got = infer(client, x)
    want = dict(zip(OUTPUTS, ort_session.run(list(OUTPUTS), {"images": x})))
    for name in OUTPUTS:
        assert got[name].shape == want[name].shape == ((n, 3234, 4) if "box" in name else (n, 3234, 91))
        rtol, atol = TOL[name]
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
    for (gi, gl, gs, gb), (wi, wl, ws, wb) in zip(detections(got["boxes"], got["scores"]),
                                                  detections(want["boxes"], want["scores"])):
        # Ranks may swap only between anchors whose scores tie within the tolerance.
        close = np.abs(ws - gs) <= 1e-6 + 1e-4 * np.abs(ws)
        assert close.all()
        same = gi == wi
        assert same.sum() >= len(gi) - 2, (gi, wi)
        np.testing.assert_array_equal(gl[same], wl[same])
        np.testing.assert_allclose(gb[same], wb[same], rtol=1e-4, atol=2e-3)
    # The boxes lie in the image and the scores are distributions.
    assert got["boxes"].min() >= 0 and got["boxes"].max() <= 320
    np.testing.assert_allclose(got["scores"].sum(-1), 1.0, atol=1e-5)


def test_ssdlite_concurrent_images_batched(ssd_server, ort_session):
    n = 6
    xs = images(11, n)
    want = ort_session.run(list(OUTPUTS), {"images": xs})
    stats = lambda: httpclient.InferenceServerClient(ssd_server.url).get_inference_statistics("ssdlite_batch")["model_stats"][0]
    before = stats()
    clients = [httpclient.InferenceServerClient(ssd_server.url) for _ in range(n)]
    results = [None] * n
    go = threading.Barrier(n)

    def one(k):
        go.wait()
        results[k] = infer(clients[k], xs[k:k + 1], "ssdlite_batch")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k, got in enumerate(results):
        assert got is not None, f"image {k} got no answer"
        for name, w in zip(OUTPUTS, want):
            rtol, atol = TOL[name]
            np.testing.assert_allclose(got[name], w[k:k + 1], rtol=rtol, atol=atol, err_msg=f"{name} image {k}")
    after = stats()
    assert int(after["inference_count"]) - int(before["inference_count"]) == n
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions < n, f"{executions} executions for {n} concurrent images: no batching"
    print(f"{n} concurrent images ran in {executions} executions")


def assert_rejected(client, model, x, datatype):
    """x as input 'images' of model is a 400 whose message names the input."""
    i = httpclient.InferInput("images", list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=True)
    with pytest.raises(httpclient.InferenceServerException) as e:
        client.infer(model, [i])
    assert "400" in str(e.value.status()), e.value
    assert "images" in e.value.message(), e.value.message()


def test_ssdlite_bad_requests(ssd_server, ort_session):
    client = httpclient.InferenceServerClient(ssd_server.url)
    url = ssd_server.url
    for shape in ([1, 3, 300, 300], [1, 1, 320, 320], [3, 320, 320]):
        assert_rejected(client, "ssdlite", np.zeros(shape, dtype=np.float32), "FP32")
    assert_rejected(client, "ssdlite", np.zeros((1, 3, 320, 320), dtype=np.int64), "INT64")
    # A body whose tensor is shorter than its shape says.
    status, _, body = raw_request(url, "POST", "/v2/models/ssdlite/infer",
                                  b'{"inputs": [{"name": "images", "shape": [1, 3, 320, 320], "datatype": "FP32", '
                                  b'"data": [0.5, 0.5]}]}', {"Content-Type": "application/json"})
    assert status == 400, body
    assert b"images" in body, body
    # Still serving, and still right.
    assert client.is_model_ready("ssdlite")
    x = images(7, 1)
    got = infer(client, x)
    want = ort_session.run(["cls_logits"], {"images": x})[0]
    np.testing.assert_allclose(got["cls_logits"], want, rtol=1e-4, atol=1e-4)


# ---- the full detector, postprocessing included ---------------------------------

FULL_OUTPUTS = ("boxes", "scores", "labels")


@pytest.fixture(scope="module")
def ort_full():
    return ort.InferenceSession(str(FULL), providers=["CPUExecutionProvider"])


def check_same_detections(got, want):
    """The same detections in the same order, up to swaps of detections
    whose scores tie within the two engines' rounding (their scores differ
    by up to about 1.5e-6, and a few neighbours in onnxruntime's ranking
    are closer than that)."""
    d = len(want["scores"])
    assert got["boxes"].shape == (d, 4) and got["scores"].shape == (d,) and got["labels"].shape == (d,)
    assert got["labels"].dtype == np.int64
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=2e-6)
    tie = 2e-6 + 1e-5 * np.abs(want["scores"])
    swapped = 0
    for i in range(d):
        if got["labels"][i] == want["labels"][i] and np.allclose(got["boxes"][i], want["boxes"][i], rtol=1e-4, atol=2e-3):
            continue
        near = np.flatnonzero(np.abs(want["scores"] - want["scores"][i]) <= tie[i])
        match = [j for j in near if got["labels"][i] == want["labels"][j]
                 and np.allclose(got["boxes"][i], want["boxes"][j], rtol=1e-4, atol=2e-3)]
        assert match, f"detection {i}: label {got['labels'][i]} box {got['boxes'][i]} score {got['scores'][i]} " \
                      f"is not onnxruntime's (label {want['labels'][i]} box {want['boxes'][i]}) nor a tie of it"
        swapped += 1
    assert swapped <= 4, f"{swapped} detections differ by ties"


@pytest.mark.parametrize("seed", [0, 2, 5, 29])
def test_full_ssdlite_matches_onnxruntime(ssd_server, ort_full, seed):
    client = httpclient.InferenceServerClient(ssd_server.url)
    x = images(seed, 1)
    got = infer(client, x, "ssdlite_full", FULL_OUTPUTS)
    want = dict(zip(FULL_OUTPUTS, ort_full.run(list(FULL_OUTPUTS), {"images": x})))
    assert len(want["scores"]) > 0
    check_same_detections(got, want)
    # Detections come best first, inside the image, with real classes.
    assert (np.diff(got["scores"]) <= 0).all()
    assert got["boxes"].min() >= 0 and got["boxes"].max() <= 320
    assert got["labels"].min() >= 1 and got["labels"].max() <= 90


def test_full_ssdlite_concurrent_images(ssd_server, ort_full):
    """Two instances' worth of requests at once: each image gets its own
    detections (the values of one run never leak into another)."""
    n = 3
    xs = [images(20 + k, 1) for k in range(n)]
    want = [dict(zip(FULL_OUTPUTS, ort_full.run(list(FULL_OUTPUTS), {"images": x}))) for x in xs]
    results = [None] * n
    go = threading.Barrier(n)

    def one(k):
        go.wait()
        results[k] = infer(httpclient.InferenceServerClient(ssd_server.url), xs[k], "ssdlite_full", FULL_OUTPUTS)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k in range(n):
        assert results[k] is not None, f"image {k} got no answer"
        check_same_detections(results[k], want[k])


def test_full_ssdlite_bad_requests(ssd_server, ort_full):
    client = httpclient.InferenceServerClient(ssd_server.url)
    for shape in ([1, 3, 300, 300], [2, 3, 320, 320], [3, 320, 320]):
        assert_rejected(client, "ssdlite_full", np.zeros(shape, dtype=np.float32), "FP32")
    assert_rejected(client, "ssdlite_full", np.zeros((1, 3, 320, 320), dtype=np.float64), "FP64")
    # Still serving, and still right.
    assert client.is_model_ready("ssdlite_full")
    x = images(7, 1)
    want = dict(zip(FULL_OUTPUTS, ort_full.run(list(FULL_OUTPUTS), {"images": x})))
    check_same_detections(infer(client, x, "ssdlite_full", FULL_OUTPUTS), want)
