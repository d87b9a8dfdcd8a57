"""What a new user does first, with real tools: the README's own snippets, a
repository with broken models, scikit-learn exports, hostile requests, and the
kiln run / bench / doctor commands. Each test pins a behaviour a user relies on
(a clear message, the right exit status, the right numbers)."""
import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import DIGITS, KILN, ROOT, raw_request, save_model, tiny_graph

README = (ROOT / "README.md").read_text()


def kiln(*args, timeout=60):
    return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=timeout)


# ---- the README's first screen -------------------------------------------------

@pytest.mark.skipif(not DIGITS.exists(), reason="the example digits model is missing")
def test_readme_snippets_run_as_written(tmp_path, make_server):
    """The README's curl body and tritonclient snippet, with only the address changed."""
    s = make_server(ROOT / "model_repository", log_path=tmp_path / "kiln.log")
    curl = re.search(r"curl -s localhost:8000/v2/models/digits/infer -d '(\{.*?\})'", README, re.S)
    assert curl, "the README lost its curl example"
    st, _, body = raw_request(s.url, "POST", "/v2/models/digits/infer", curl.group(1))
    assert st == 200, body
    out = {o["name"]: o for o in json.loads(body)["outputs"]}
    # The README's image is the first digit of scikit-learn's set: a 0.
    assert out["label"]["data"] == [0]
    assert out["probabilities"]["shape"] == [1, 10]

    snippet = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert 'InferenceServerClient("localhost:8000")' in snippet
    snippet = snippet.replace('"localhost:8000"', repr(s.url))
    r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    label, probs = r.stdout.split("]", 1)
    assert re.fullmatch(r"\[\d", label.strip()), r.stdout
    assert probs.count(".") >= 10, r.stdout  # ten probabilities printed


# ---- a repository with mistakes --------------------------------------------------

def test_every_broken_model_is_logged_and_indexed(tmp_path, make_server):
    repo = tmp_path / "repo"
    save_model(repo, "good", tiny_graph())
    save_model(repo, "badjson", tiny_graph(), config="{not json")
    save_model(repo, "toobig", tiny_graph(), config='{"max_batch_size": 100000000}')
    (repo / "noversion").mkdir()
    save_model(repo, "zero", tiny_graph(), version=0)
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "1" / "model.onnx").write_bytes(b"\x08\x07garbage" * 50)
    s = make_server(repo)
    log = s.text()
    for name in ("badjson", "toobig", "noversion", "zero", "garbage"):
        assert re.search(rf"error .*model '{name}'", log), f"no log line for {name}:\n{log}"
    assert "5 models failed to load (see above)" in log
    assert "not valid JSON (error at byte" in log
    assert "'max_batch_size' must be an integer from 0 to" in log
    st, _, body = raw_request(s.url, "POST", "/v2/repository/index", "{}")
    index = {e["name"]: e for e in json.loads(body)}
    assert index["good"]["state"] == "READY"
    assert "no version folder" in index["zero"]["reason"]


def test_config_fields_kiln_cannot_honour_are_refused(tmp_path, make_server):
    repo = tmp_path / "repo"
    save_model(repo, "ragged", tiny_graph(), config='{"batch_input": [{"kind": "BATCH_ELEMENT_COUNT", '
                                                    '"target_name": ["n"], "data_type": "TYPE_FP32", "source_input": ["x"]}]}')
    save_model(repo, "pinned", tiny_graph(), config='{"version_policy": {"specific": {"versions": [3]}}}')
    s = make_server(repo)
    st, _, body = raw_request(s.url, "POST", "/v2/repository/index", "{}")
    index = {e["name"]: e for e in json.loads(body)}
    assert index["ragged"]["state"] == "UNAVAILABLE"
    assert "'batch_input' is not supported" in index["ragged"]["reason"]
    assert "selects none of the versions present (1)" in index["pinned"]["reason"]


def test_an_input_of_unknown_rank_is_explained(tmp_path, make_server):
    import onnx.helper as oh
    from onnx import TensorProto as TP
    g = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "unk", [oh.make_tensor_value_info("x", TP.FLOAT, None)],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    repo = tmp_path / "repo"
    save_model(repo, "anyrank", g)
    save_model(repo, "given", g, config='{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2, 3]}]}')
    s = make_server(repo)
    assert "model 'anyrank' version 1: input 'x' has no shape" in s.text()
    assert not [line for line in s.text().splitlines() if " warn " in line and "model 'given'" in line]
    meta = json.loads(raw_request(s.url, "GET", "/v2/models/given")[2])
    assert meta["inputs"][0]["shape"] == [2, 3]


def test_empty_repository_warns(tmp_path, make_server):
    (tmp_path / "empty").mkdir()
    s = make_server(tmp_path / "empty")
    assert "holds no model folder" in s.text()
    assert raw_request(s.url, "GET", "/v2/health/ready")[0] == 200


def test_serve_config_file_mistakes_are_named(tmp_path):
    cfg = tmp_path / "kiln.json"
    cfg.write_text('{"http_threads": 1.5}')
    r = kiln("serve", "--config", str(cfg), timeout=30)
    assert r.returncode == 2 and "invalid value '1.5' for http-threads" in r.stderr, r.stderr
    cfg.write_text('{"http_port": 8000,, }')
    r = kiln("serve", "--config", str(cfg), timeout=30)
    assert r.returncode == 2 and "not valid JSON (error at byte" in r.stderr, r.stderr


# ---- scikit-learn exports ----------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")  # scikit-learn's convergence warnings
def test_sklearn_classifiers_match_onnxruntime_and_zipmap_is_explained(tmp_path, make_server):
    ort = pytest.importorskip("onnxruntime")
    skl2onnx = pytest.importorskip("skl2onnx")
    import tritonclient.http as httpclient
    from sklearn.datasets import load_iris
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    models = {
        "logreg": LogisticRegression(max_iter=500),
        "forest": RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0),
        "boost": GradientBoostingClassifier(n_estimators=8, random_state=0),
        "mlp": make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(16,), max_iter=300, random_state=0)),
    }
    repo = tmp_path / "repo"
    for name, m in models.items():
        m.fit(X, y)
        onx = skl2onnx.to_onnx(m, X[:1], options={id(m): {"zipmap": False}},
                               target_opset={"": 17, "ai.onnx.ml": 3})
        (repo / name / "1").mkdir(parents=True)
        onnx.save(onx, str(repo / name / "1" / "model.onnx"))
    zm = LogisticRegression(max_iter=500).fit(X, y)
    (repo / "zipmap" / "1").mkdir(parents=True)
    onnx.save(skl2onnx.to_onnx(zm, X[:1], target_opset={"": 17, "ai.onnx.ml": 3}),
              str(repo / "zipmap" / "1" / "model.onnx"))
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    try:
        batch = X[::5]  # 30 rows, within the default max_batch_size
        for name in models:
            assert c.is_model_ready(name), s.text()
            ref = ort.InferenceSession(str(repo / name / "1" / "model.onnx")).run(None, {"X": batch})
            x = httpclient.InferInput("X", list(batch.shape), "FP32")
            x.set_data_from_numpy(batch)
            r = c.infer(name, [x])
            np.testing.assert_array_equal(r.as_numpy("label"), ref[0])
            np.testing.assert_allclose(r.as_numpy("probabilities"), ref[1], atol=1e-5)
        assert not c.is_model_ready("zipmap")
        reason = {e["name"]: e["reason"] for e in c.get_model_repository_index()}["zipmap"]
        assert "ZipMap" in reason and "'zipmap': False" in reason, reason
    finally:
        c.close()


# ---- hostile requests ----------------------------------------------------------------

def test_encoded_nul_in_a_model_name_is_refused(repo, make_server):
    s = make_server(repo, "--model-control-mode", "explicit")
    st, _, body = raw_request(s.url, "POST", "/v2/repository/models/tiny%00x/load", "")
    assert st == 400 and b"NUL" in body, body
    st, _, body = raw_request(s.url, "GET", "/v2/models/tiny%00x/config")
    assert st == 400, body
    st, _, body = raw_request(s.url, "POST", "/v2/repository/index", "{}")
    assert {e["name"]: e["state"] for e in json.loads(body)}["tiny"] != "READY"


def test_a_body_over_the_limit_gets_an_error_tritonclient_can_read(repo, make_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    s = make_server(repo, "--max-request-size", "8192")
    c = httpclient.InferenceServerClient(s.url)
    try:
        x = httpclient.InferInput("x", [1, 512], "FP32")
        x.set_data_from_numpy(np.random.default_rng(0).random((1, 512), dtype=np.float32), binary_data=False)
        with pytest.raises(InferenceServerException) as e:
            c.infer("slow", [x])
        assert e.value.status() == "413" or e.value.status() == 413
        assert "--max-request-size (8192 bytes)" in e.value.message(), e.value.message()
        assert c.is_server_live()
    finally:
        c.close()


def test_unknown_model_and_version_messages_say_what_exists(repo, make_server):
    s = make_server(repo, "--model-control-mode", "explicit", "--load-model", "multi")
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    st, _, raw = raw_request(s.url, "POST", "/v2/models/tiny/infer", body)
    assert st == 404 and b"in the repository but the model is not loaded" in raw, raw
    st, _, raw = raw_request(s.url, "POST", "/v2/models/nope/infer", body)
    assert st == 404 and json.loads(raw)["error"] == "Request for unknown model: 'nope' is not found", raw
    st, _, raw = raw_request(s.url, "POST", "/v2/models/multi/versions/7/infer", body)
    assert st == 404 and b"versions loaded: 1, 2" in raw, raw


def test_non_finite_floats_in_json_as_tritonclient_writes_them(tmp_path, make_server):
    import onnx.helper as oh
    import tritonclient.http as httpclient
    from onnx import TensorProto as TP
    repo = tmp_path / "repo"
    save_model(repo, "ident", oh.make_graph(
        [oh.make_node("Identity", ["f"], ["f_out"]), oh.make_node("Identity", ["s"], ["s_out"])], "ident",
        [oh.make_tensor_value_info("f", TP.FLOAT, ["N", 4]), oh.make_tensor_value_info("s", TP.STRING, ["N", 2])],
        [oh.make_tensor_value_info("f_out", TP.FLOAT, ["N", 4]), oh.make_tensor_value_info("s_out", TP.STRING, ["N", 2])]))
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    try:
        f = np.array([[np.nan, np.inf, -np.inf, 1.5]], np.float32)
        strs = np.array([["NaN", 'say "Infinity"']], dtype=object)
        a = httpclient.InferInput("f", [1, 4], "FP32")
        a.set_data_from_numpy(f, binary_data=False)  # rapidjson writes NaN, Infinity, -Infinity
        b = httpclient.InferInput("s", [1, 2], "BYTES")
        b.set_data_from_numpy(strs, binary_data=False)
        outs = [httpclient.InferRequestedOutput("f_out", binary_data=False),
                httpclient.InferRequestedOutput("s_out", binary_data=False)]
        r = c.infer("ident", [a, b], outputs=outs)
        np.testing.assert_array_equal(r.as_numpy("f_out"), f)
        assert [x.decode() if isinstance(x, bytes) else x for x in r.as_numpy("s_out").ravel()] == ["NaN", 'say "Infinity"']
    finally:
        c.close()
    body = '{"inputs": [{"name": "f", "shape": [1, 4], "datatype": "FP32", "data": [NaN, 1, 2, Nope]}, ' \
           '{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}'
    st, _, raw = raw_request(s.url, "POST", "/v2/models/ident/infer", body)
    assert st == 400 and b"malformed JSON" in raw, raw


def test_json_numbers_that_cannot_be_carried_exactly_are_refused(server):
    def infer(model, inputs):
        return raw_request(server.url, "POST", f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}))

    for data, what in ((None, b"not null"), ({"a": 1}, b"not an object")):
        st, _, body = infer("tiny", [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": data}])
        assert st == 400 and b"'data' must be an array" in body and what in body, body
    st, _, body = infer("tiny", [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1e300, 0, 0, 0]}])
    assert st == 400 and b"out of range for FP32" in body, body
    flag = {"name": "flag", "shape": [2, 3], "datatype": "BOOL", "data": [True] * 6}
    # INT64 as plain JSON integers is exact over its whole range (past 2^53, where doubles stop).
    big = 2 ** 53 + 1
    st, _, body = infer("typed", [{"name": "i", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, big]}, flag])
    assert st == 200, body
    out = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert out["a"]["data"][5] == big + 1
    st, _, body = infer("typed", [{"name": "i", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 2 ** 63]}, flag])
    assert st == 400 and b"input 'i': data[5] = 9223372036854775808 is out of range for INT64" in body, body
    # Written with an exponent, a value past 2^53 is a double's, not exact: refused, saying how to send it.
    st, _, body = infer("typed", [{"name": "i", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 9.1e15]}, flag])
    assert st == 400 and b"2^53" in body and b"plain integers" in body, body


# ---- kiln run / bench / doctor -----------------------------------------------------

def test_kiln_run_refuses_bad_numbers(repo, tmp_path):
    model = str(repo / "tiny" / "1" / "model.onnx")
    for flag, value in (("--iterations", "abc"), ("--batch", "0"), ("--batch", "2x"), ("--threads", "-1"),
                        ("--seed", "x")):
        r = kiln("run", model, flag, value)
        assert r.returncode == 2, (flag, value, r.stdout, r.stderr)
        assert flag in r.stderr and value in r.stderr, r.stderr
    r = kiln("run", model, "--batch")
    assert r.returncode == 2 and "--batch needs a value" in r.stderr, r.stderr
    r = kiln("run", model, "--batch", "3", "--iterations", "5", "--output-dir", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "[3,3]" in r.stdout and "latency over 5 runs" in r.stdout
    assert np.load(tmp_path / "out" / "probs.npy").shape == (3, 3)


def test_kiln_bench_says_why_it_cannot_run(server):
    r = kiln("bench", "-u", server.url, "-m", "nope", "-n", "5")
    assert r.returncode == 2 and "HTTP 404" in r.stderr and "unknown model" in r.stderr, r.stderr
    r = kiln("bench", "-u", server.url, "-m", "tiny", "-b", "1000", "-n", "5")
    assert r.returncode == 2 and "max_batch_size 32" in r.stderr, r.stderr
    r = kiln("bench", "-u", server.url, "-m", "typed", "-b", "4", "-n", "5")
    assert r.returncode == 2 and "does not batch" in r.stderr, r.stderr
    for bad in ("x:1,abc", "y:1,4", "x"):
        r = kiln("bench", "-u", server.url, "-m", "tiny", "--shape", bad, "-n", "5")
        assert r.returncode == 2 and f"--shape {bad}:" in r.stderr, r.stderr
    r = kiln("bench", "-u", server.url, "-m", "tiny", "-b", "4", "-n", "50", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"c=1\s+\d", r.stdout), r.stdout


def test_kiln_bench_checks_a_perf_analyzer_data_file(server, tmp_path):
    good, typo = tmp_path / "good.json", tmp_path / "typo.json"
    good.write_text(json.dumps({"data": [{"x": {"content": [1, 2, 3, 4], "shape": [4]}}]}))
    typo.write_text(json.dumps({"data": [{"X": [1, 2, 3, 4]}]}))
    r = kiln("bench", "-u", server.url, "-m", "tiny", "--input-data", str(good), "-n", "10", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    # perf_analyzer's convention: "shape" without the batch dim, one sample repeated per row.
    r = kiln("bench", "-u", server.url, "-m", "tiny", "-b", "3", "--input-data", str(good), "-n", "10", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    r = kiln("bench", "-u", server.url, "-m", "tiny", "--input-data", str(typo), "-n", "10", "--no-progress")
    assert r.returncode == 2 and "no input named 'X'" in r.stderr, r.stderr


def test_kiln_bench_reports_the_servers_error_and_fails(tmp_path, make_server):
    """Every request refused (a config that disagrees with the model only at run
    time is hard to make, so: a model whose input the bench cannot shape right)."""
    repo = tmp_path / "repo"
    save_model(repo, "tiny", tiny_graph())
    s = make_server(repo)
    r = kiln("bench", "-u", s.url, "-m", "tiny", "--shape", "x:1,5", "-n", "5", "--no-progress")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed with HTTP 400: " in r.stdout and "does not match model 'tiny'" in r.stdout, r.stdout


def test_kiln_doctor_without_a_gpu_says_so():
    r = kiln("doctor")
    if "verdict: no GPU" not in r.stdout:
        pytest.skip("this machine has a GPU")
    assert r.returncode == 2
    assert "CPU backend" in r.stdout


@pytest.mark.filterwarnings("ignore::FutureWarning")  # SVC(probability=True) is deprecated in newer scikit-learn
def test_sklearn_support_vector_machines_match_onnxruntime(tmp_path, make_server):
    """SVC exports as SVMClassifier (pairwise scores, or probabilities by
    pairwise coupling with probability=True), SVR as SVMRegressor."""
    ort = pytest.importorskip("onnxruntime")
    skl2onnx = pytest.importorskip("skl2onnx")
    import tritonclient.http as httpclient
    from sklearn.datasets import load_iris
    from sklearn.svm import SVC, SVR

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    repo = tmp_path / "repo"
    cases = {}
    for kernel in ("rbf", "poly", "linear", "sigmoid"):
        for prob in (False, True):
            for nclass in (2, 3):
                m = SVC(kernel=kernel, probability=prob, coef0=0.5, random_state=0).fit(X[y < nclass], y[y < nclass])
                cases[f"svc_{kernel}_{int(prob)}_{nclass}"] = (m, {id(m): {"zipmap": False}}, X)
    cases["svr"] = (SVR(kernel="rbf").fit(X[:, :3], X[:, 3]), None, X[:, :3])
    for name, (m, opts, data) in cases.items():
        (repo / name / "1").mkdir(parents=True)
        onnx.save(skl2onnx.to_onnx(m, data[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3}),
                  str(repo / name / "1" / "model.onnx"))
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    try:
        for name, (m, _, data) in cases.items():
            batch = np.ascontiguousarray(data[::5])
            sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
            ref = sess.run(None, {"X": batch})
            x = httpclient.InferInput("X", list(batch.shape), "FP32")
            x.set_data_from_numpy(batch)
            r = c.infer(name, [x])
            for o, want in zip(sess.get_outputs(), ref):
                got = r.as_numpy(o.name)
                assert got.shape == want.shape, (name, o.name, got.shape, want.shape)
                if want.dtype.kind == "f":
                    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3, err_msg=f"{name} {o.name}")
                else:
                    np.testing.assert_array_equal(got, want, err_msg=f"{name} {o.name}")
    finally:
        c.close()
