"""A typical scikit-learn tabular pipeline, exported with skl2onnx and served:
ColumnTransformer(SimpleImputer + StandardScaler on numbers, OneHotEncoder on
string categories, unknown ones ignored) into LogisticRegression. Numbers
with NaNs and strings (one category never seen in training) go in over HTTP;
the answers equal onnxruntime's."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

skl2onnx = pytest.importorskip("skl2onnx")
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402
from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType  # noqa: E402


def data(n, seed):
    rng = np.random.default_rng(seed)
    num = rng.normal(size=(n, 2)).astype(np.float32)
    num[rng.random(n) < 0.15, 0] = np.nan
    cat = np.stack([rng.choice(["red", "green", "blue"], n), rng.choice(["s", "m", "l", "xl"], n)], 1)
    return num, cat


def export(tmp_path, cat_type, impute_strategy="mean"):
    num, cat = data(300, 0)
    y = ((np.nan_to_num(num[:, 0]) + num[:, 1] > 0) ^ (cat[:, 0] == "red")).astype(np.int64)
    cat_in = cat if cat_type == "string" else np.searchsorted(["blue", "green", "red"], cat[:, :1]).astype(np.int64)
    cols_cat = [2, 3] if cat_type == "string" else [2]
    pre = ColumnTransformer([
        ("num", Pipeline([("imp", SimpleImputer(strategy=impute_strategy)), ("sc", StandardScaler())]), [0, 1]),
        ("cat", OneHotEncoder(handle_unknown="ignore"), cols_cat)])
    X = np.concatenate([num.astype(object), cat_in.astype(object)], 1)
    pipe = Pipeline([("pre", pre), ("lr", LogisticRegression())]).fit(X, y)
    types = [("num", FloatTensorType([None, 2])),
             ("cat", StringTensorType([None, 2]) if cat_type == "string" else Int64TensorType([None, 1]))]
    m = skl2onnx.to_onnx(pipe, initial_types=types, options={id(pipe): {"zipmap": False}},
                         target_opset={"": 17, "ai.onnx.ml": 3})
    d = tmp_path / "repo" / "tabular" / "1"
    d.mkdir(parents=True)
    onnx.save(m, str(d / "model.onnx"))
    return d / "model.onnx"


@pytest.mark.parametrize("cat_type,strategy", [("string", "mean"), ("string", "median"), ("int64", "mean")])
def test_tabular_pipeline_matches_onnxruntime(make_server, tmp_path, cat_type, strategy):
    path = export(tmp_path, cat_type, strategy)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Imputer", "OneHotEncoder"} <= ops, ops
    s = make_server(tmp_path / "repo")
    c = httpclient.InferenceServerClient(s.url)
    num, cat = data(25, 7)
    cat[3, 0] = "purple"  # never seen in training: handle_unknown="ignore" gives zeros
    if cat_type == "int64":
        cat = np.searchsorted(["blue", "green", "red"], cat[:, :1]).astype(np.int64)
        cat[4, 0] = 9
    want = ort.InferenceSession(str(path)).run(None, {"num": num, "cat": cat.astype(object) if cat_type == "string" else cat})
    ins = [httpclient.InferInput("num", list(num.shape), "FP32"),
           httpclient.InferInput("cat", list(cat.shape), "BYTES" if cat_type == "string" else "INT64")]
    ins[0].set_data_from_numpy(num, binary_data=False)
    ins[1].set_data_from_numpy(cat.astype(object) if cat_type == "string" else cat, binary_data=False)
    r = c.infer("tabular", ins)
    np.testing.assert_array_equal(r.as_numpy("label"), want[0])
    np.testing.assert_allclose(r.as_numpy("probabilities"), want[1], rtol=1e-5, atol=1e-6)
    c.close()
