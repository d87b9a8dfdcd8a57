"""Padded batching on models exported from transformers (tests/data/sequence,
made by tests/models/make_sequence_models.py): BERT, DistilBERT and a sentence
embedder with masked mean pooling. Concurrent clients send requests of mixed
lengths; each answer must equal onnxruntime's on that request alone, while
the server batches requests of different lengths together."""
import concurrent.futures as cf
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, raw_request

DATA = ROOT / "tests" / "data" / "sequence"
MODELS = {
    "bert": ("input_ids", "attention_mask", "token_type_ids"),
    "distilbert": ("input_ids", "attention_mask"),
    "sentence": ("input_ids", "attention_mask"),
}
pytestmark = pytest.mark.skipif(not (DATA / "bert.onnx").exists(), reason="tests/data/sequence is missing")


def make_repo(root, padding, max_batch=8, buckets=(16, 32, 64, 128)):
    for name in MODELS:
        d = Path(root) / name / "1"
        d.mkdir(parents=True)
        shutil.copy(DATA / f"{name}.onnx", d / "model.onnx")
        cfg = {"max_batch_size": max_batch, "dynamic_batching": {}}
        if padding:
            cfg["sequence_padding"] = {"enable": True, "buckets": list(buckets)}
        (Path(root) / name / "config.json").write_text(json.dumps(cfg))
    return root


def requests(n, seed, lo=8, hi=128):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length, rows = int(rng.integers(lo, hi + 1)), int(rng.integers(1, 3))
        ids = rng.integers(1, 1000, (rows, length)).astype(np.int64)
        mask = np.ones((rows, length), np.int64)
        tt = np.zeros((rows, length), np.int64)
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})
    return out


def infer(url, model, req):
    c = httpclient.InferenceServerClient(url)
    try:
        ins = []
        for name in MODELS[model]:
            x = httpclient.InferInput(name, list(req[name].shape), "INT64")
            x.set_data_from_numpy(req[name], binary_data=True)
            ins.append(x)
        r = c.infer(model, ins)
        return {o["name"]: r.as_numpy(o["name"]) for o in r.get_response()["outputs"]}
    finally:
        c.close()


def stats(url, model):
    _, _, body = raw_request(url, "GET", f"/v2/models/{model}/stats")
    return json.loads(body)["model_stats"][0]


@pytest.mark.parametrize("model", list(MODELS))
def test_mixed_lengths_equal_alone(make_server, tmp_path, model):
    s = make_server(make_repo(tmp_path / "repo", padding=True))
    assert f"model '{model}': plans for 4 length buckets" in s.text()
    sess = ort.InferenceSession(str(DATA / f"{model}.onnx"))
    reqs = requests(96, seed=hash(model) % 1000)
    with cf.ThreadPoolExecutor(24) as ex:
        got = list(ex.map(lambda r: infer(s.url, model, r), reqs))
    names = [o.name for o in sess.get_outputs()]
    worst = 0.0
    for req, out in zip(reqs, got):
        want = sess.run(None, {n: req[n] for n in MODELS[model]})
        for name, w in zip(names, want):
            assert out[name].shape == w.shape, (name, out[name].shape, w.shape)
            worst = max(worst, float(np.abs(out[name] - w).max()))
    assert worst < 1e-4, worst
    st = stats(s.url, model)
    # Requests of different lengths ran together, padded.
    assert int(st["execution_count"]) < int(st["inference_count"])
    pad = st["padding_stats"]
    assert sum(p["real_elements"] for p in pad) < sum(p["padded_elements"] for p in pad)
    assert {p["bucket"] for p in pad} <= {16, 32, 64, 128}


def test_longer_than_every_bucket_and_metrics(make_server, tmp_path):
    s = make_server(make_repo(tmp_path / "repo", padding=True, buckets=(16, 32)))
    sess = ort.InferenceSession(str(DATA / "distilbert.onnx"))
    reqs = requests(24, seed=5, lo=20, hi=60)
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda r: infer(s.url, "distilbert", r), reqs))
    for req, out in zip(reqs, got):
        want = sess.run(None, {n: req[n] for n in MODELS["distilbert"]})[0]
        assert np.abs(out["last_hidden_state"] - want).max() < 1e-4
    _, _, text = raw_request(s.url, "GET", "/metrics")
    text = text.decode()
    assert 'kiln_padding_padded_elements_total{model="distilbert",version="1",bucket="longer"}' in text
    assert 'kiln_padding_real_elements_total{model="distilbert",version="1",bucket="32"}' in text


def test_proposal_shown_not_applied(make_server, tmp_path):
    s = make_server(make_repo(tmp_path / "repo", padding=False))
    c = httpclient.InferenceServerClient(s.url)
    sp = c.get_model_config("bert")["sequence_padding"]
    assert sp["enable"] is False
    assert [(i["name"], i["axis"]) for i in sp["inputs"]] == [
        ("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1)]
    assert sp["outputs"] == [{"name": "last_hidden_state", "axis": 1, "input": "input_ids", "input_axis": 1}]
    c.close()
    # Not enabled: requests of different lengths never share a batch.
    reqs = requests(32, seed=9)
    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda r: infer(s.url, "sentence", r), reqs))
    st = stats(s.url, "sentence")
    assert "padding_stats" not in st
    assert "plans for" not in s.text()


def test_bad_padding_config_refused(make_server, tmp_path):
    root = make_repo(tmp_path / "repo", padding=False)
    (root / "bert" / "config.json").write_text(json.dumps({
        "max_batch_size": 8, "sequence_padding": {"enable": True, "inputs": [{"name": "input_ids", "axis": 1}],
                                                  "outputs": [{"name": "pooler_output", "axis": 1,
                                                               "input": "input_ids", "input_axis": 1}]}}))
    s = make_server(root)
    _, _, body = raw_request(s.url, "POST", "/v2/repository/index")
    index = {m["name"]: m for m in json.loads(body)}
    assert index["bert"]["state"] == "UNAVAILABLE"
    assert "sequence_padding" in index["bert"]["reason"]
    assert index["distilbert"]["state"] == "READY"


def test_threads_follow_runs_not_plan_builds(make_server, tmp_path):
    """An instance moves to all the cores when its runs are long (padded
    batches of long sequences), not because runs of new shapes built plans:
    forty single requests of forty lengths, unpadded, each build a plan
    (milliseconds) around a run of a fraction of one, and leave the thread
    count alone; batches of eight 128-token sequences move it."""
    cores = __import__("os").cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: nothing to move to")
    moved = "model 'bert' instance 0: a batch took"
    s = make_server(make_repo(tmp_path / "plain", padding=False))
    for length in range(8, 48):
        infer(s.url, "bert", requests(1, seed=length, lo=length, hi=length)[0])
    assert moved not in s.text(), s.text()[-3000:]
    p = make_server(make_repo(tmp_path / "padded", padding=True))
    reqs = [{k: v[:1] for k, v in r.items()} for r in requests(96, seed=7, lo=128, hi=128)]
    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda r: infer(p.url, "bert", r), reqs))
    assert moved in p.text(), p.text()[-3000:]


def test_unpadded_lengths_keep_their_plans(make_server, tmp_path):
    """Without padding every length is its own plan: 40 lengths, sent twice,
    outgrow the 16 plans a model starts with. The cache doubles as evicted
    plans come back, and the second pass builds nothing."""
    root = tmp_path / "repo"
    d = root / "distilbert" / "1"
    d.mkdir(parents=True)
    shutil.copy(DATA / "distilbert.onnx", d / "model.onnx")
    # One thread, set: a plan is built for its thread count, and an instance
    # whose runs look heavy (ASan's slowness is enough) moves to more threads
    # once, which builds every length once more on the new count.
    (root / "distilbert" / "config.json").write_text(json.dumps({
        "max_batch_size": 4, "parameters": {"intra_op_thread_count": {"string_value": "1"}}}))
    s = make_server(root, "--log-level", "debug")
    sess = ort.InferenceSession(str(DATA / "distilbert.onnx"))
    lengths = list(range(8, 48))

    def one(length):
        rng = np.random.default_rng(length)
        req = {"input_ids": rng.integers(1, 1000, (1, length)).astype(np.int64),
               "attention_mask": np.ones((1, length), np.int64)}
        return req, infer(s.url, "distilbert", req)

    for rnd in range(3):
        for length in lengths:
            req, out = one(length)
            want = sess.run(None, req)
            np.testing.assert_allclose(out["last_hidden_state"], want[0], atol=1e-4, rtol=1e-4)
        if rnd == 1:
            builds = s.text().count("plan for ")
    assert "it holds 32 now" in s.text() and "it holds 64 now" in s.text(), s.text()[-2000:]
    assert s.text().count("plan for ") == builds, "the third pass rebuilt plans"
