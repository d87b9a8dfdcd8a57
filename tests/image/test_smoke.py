"""Smoke tests of the CPU image, run by tools/image_check.sh (make image-check)
against the image's own entrypoint: KILN_IMAGE_HTTP and KILN_IMAGE_GRPC are
its addresses, KILN_IMAGE_LOG its log. The server was started with a Redis
that asks for a password (--redis-url redis://:PASSWORD@...), so the result
cache's tier 2 is checked too. Not part of tests/e2e: these need the image."""
import os
import re
import time
import urllib.request

import numpy as np
import pytest

HTTP = os.environ.get("KILN_IMAGE_HTTP")
GRPC = os.environ.get("KILN_IMAGE_GRPC")
LOG = os.environ.get("KILN_IMAGE_LOG")

pytestmark = pytest.mark.skipif(not HTTP, reason="run by tools/image_check.sh against a running image")


def digit_row(seed):
    return np.random.default_rng(seed).uniform(0, 16, (1, 64)).astype(np.float32)


def metrics():
    with urllib.request.urlopen(f"http://{HTTP}/metrics", timeout=30) as r:
        return r.read().decode()


def metric(name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", metrics(), re.M)
    return float(m.group(1)) if m else None


def test_http_digits():
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(HTTP)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("digits")
    x = httpclient.InferInput("input", [1, 64], "FP32")
    x.set_data_from_numpy(digit_row(1))
    r = c.infer("digits", [x])
    assert r.as_numpy("probabilities").shape == (1, 10)
    assert 0 <= int(r.as_numpy("label").reshape(-1)[0]) <= 9
    c.close()


def test_grpc_digits():
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(GRPC)
    assert c.is_server_ready()
    meta = c.get_model_metadata("digits")
    assert meta.name == "digits"
    x = grpcclient.InferInput("input", [2, 64], "FP32")
    x.set_data_from_numpy(np.concatenate([digit_row(2), digit_row(3)]))
    r = c.infer("digits", [x])
    assert r.as_numpy("probabilities").shape == (2, 10)
    np.testing.assert_allclose(r.as_numpy("probabilities").sum(axis=1), 1, rtol=1e-4)
    c.close()


def test_metrics():
    text = metrics()
    assert 'kiln_inference_request_success{model="digits"' in text or "kiln_inference_count" in text, text[:2000]
    assert "kiln_cache_redis_connected" in text


def test_cache_with_redis():
    """A fresh request is stored in Redis (the password was accepted); the
    same request again is answered from the cache."""
    import tritonclient.http as httpclient
    deadline = time.monotonic() + 30
    while metric("kiln_cache_redis_connected") in (None, 0.0):
        assert time.monotonic() < deadline, open(LOG).read()[-3000:]
        time.sleep(0.1)
    stores = metric("kiln_cache_redis_stores_total")
    c = httpclient.InferenceServerClient(HTTP)
    x = httpclient.InferInput("input", [1, 64], "FP32")
    x.set_data_from_numpy(digit_row(int(time.time())))
    first = c.infer("digits", [x]).as_numpy("probabilities")
    while metric("kiln_cache_redis_stores_total") <= stores:
        assert time.monotonic() < deadline, "the answer was not stored in Redis"
        time.sleep(0.05)
    second = c.infer("digits", [x]).as_numpy("probabilities")
    np.testing.assert_array_equal(first, second)
    s = c.get_inference_statistics("digits")["model_stats"][0]["inference_stats"]
    assert int(s["cache_hit"]["count"]) >= 1
    c.close()
