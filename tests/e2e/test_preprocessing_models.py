"""Audio and text preprocessing served by the real kiln and compared with
onnxruntime, through the official tritonclient:

  logmel   a Whisper-style log-mel spectrogram exported from torch
           (torch.stft -> STFT, reflection padding, mel filter bank, log10),
           tests/data/text_audio/logmel.onnx
  whisper  the same front end written with ONNX's own signal operators
           (HannWindow, STFT, MelWeightMatrix), as ONNX-side Whisper
           preprocessing graphs do
  tfidf    a scikit-learn TfidfVectorizer + LogisticRegression text
           classifier converted by skl2onnx (StringNormalizer with English
           stopwords, com.microsoft Tokenizer, TfIdfVectorizer over uni- and
           bigrams), tests/data/text_audio/tfidf.onnx

  tokenize_* com.microsoft Tokenizer alone in each of its modes (separators
           as regular expressions, tokenexp, characters; marks, mincharnum,
           padding), compared string for string

tests/models/make_text_audio_models.py makes the two .onnx files.
"""
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
from onnx.reference import ReferenceEvaluator
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP

from conftest import save_model

DATA = Path(__file__).resolve().parents[1] / "data" / "text_audio"
RATE = 16000


def audio(n, samples, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    tones = [np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=n)]
    return (np.stack(tones) * 0.5 + rng.normal(0, 0.05, (n, samples))).astype(np.float32)


def whisper_graph():
    """audio [N, samples] -> log_mel [N, frames, 80] with ONNX signal ops."""
    c = lambda name, v, dt=TP.INT64: oh.make_node("Constant", [], [name], value=oh.make_tensor(name, dt, [], [v]))  # noqa: E731
    nodes = [
        c("n_fft", 400), c("hop", 160), c("n_mels", 80), c("rate", RATE),
        c("lo", 0.0, TP.FLOAT), c("hi", 8000.0, TP.FLOAT), c("floor", 1e-10, TP.FLOAT),
        oh.make_node("Constant", [], ["axes"], value=oh.make_tensor("axes", TP.INT64, [1], [-1])),
        oh.make_node("HannWindow", ["n_fft"], ["window"]),
        oh.make_node("Unsqueeze", ["audio", "axes"], ["signal"]),
        oh.make_node("STFT", ["signal", "hop", "window", "n_fft"], ["spec"]),
        oh.make_node("ReduceSumSquare", ["spec"], ["power"], axes=[-1], keepdims=0),
        oh.make_node("MelWeightMatrix", ["n_mels", "n_fft", "rate", "lo", "hi"], ["mel_w"]),
        oh.make_node("MatMul", ["power", "mel_w"], ["mel"]),
        oh.make_node("Max", ["mel", "floor"], ["clamped"]),
        oh.make_node("Log", ["clamped"], ["log_mel"]),
    ]
    return oh.make_graph(nodes, "whisper_frontend", [oh.make_tensor_value_info("audio", TP.FLOAT, ["N", "samples"])],
                         [oh.make_tensor_value_info("log_mel", TP.FLOAT, ["N", "frames", 80])])


TOKENIZERS = {
    "tokenize_seps_marked": dict(separators=[" ", "[.]", ",", ";"], mincharnum=2, mark=1, pad_value="#"),
    "tokenize_seps": dict(separators=[" ", "[.]", ",", ";"], mincharnum=1, mark=0, pad_value="#"),
    "tokenize_exp": dict(tokenexp="[a-zA-Z]+", mincharnum=1, mark=1, pad_value="#"),
    "tokenize_chars": dict(separators=[""], mincharnum=1, mark=0, pad_value="~"),
}


def tokenizer_model(attrs):
    node = oh.make_node("Tokenizer", ["text"], ["tokens"], domain="com.microsoft", **attrs)
    graph = oh.make_graph([node], "tokenize", [oh.make_tensor_value_info("text", TP.STRING, ["N", "C"])],
                          [oh.make_tensor_value_info("tokens", TP.STRING, ["N", "C", "T"])])
    m = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("preprocessing_repo")
    for name in ("logmel", "tfidf"):
        d = root / name / "1"
        d.mkdir(parents=True)
        shutil.copy(DATA / f"{name}.onnx", d / "model.onnx")
    save_model(root, "whisper", whisper_graph(), opset=17)
    for name, attrs in TOKENIZERS.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(tokenizer_model(attrs), str(root / name / "1" / "model.onnx"))
    return root


@pytest.fixture(scope="module")
def served(repo):
    from conftest import KilnServer
    s = KilnServer(repo)
    yield s
    s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()


def infer_audio(client, model, x):
    inp = httpclient.InferInput("audio", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return client.infer(model, [inp]).as_numpy("log_mel")


def logmel_float64(path, x):
    """logmel.onnx's computation in float64 with numpy's FFT."""
    m = onnx.load(str(path))
    filters = [onnx.numpy_helper.to_array(t) for t in m.graph.initializer]
    filters = next(f for f in filters if f.shape == (80, 201)).astype(np.float64)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    xp = np.pad(x.astype(np.float64), ((0, 0), (200, 200)), mode="reflect")
    frames = 1 + (xp.shape[1] - 400) // 160
    spec = np.stack([np.fft.rfft(xp[:, f * 160:f * 160 + 400] * window, axis=-1) for f in range(frames)], 2)
    log_spec = np.log10(np.maximum(filters @ (np.abs(spec) ** 2)[:, :, :-1], 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max(axis=(1, 2), keepdims=True) - 8)
    return (log_spec + 4) / 4


@pytest.mark.parametrize("model", ["logmel", "whisper"])
def test_log_mel_matches_onnxruntime(served, repo, model):
    path = repo / model / "1" / "model.onnx"
    sess = ort.InferenceSession(str(path))
    c = httpclient.InferenceServerClient(served.url)
    # One second of two clips, then half a second of one: a plan per length.
    for n, samples, seed in ((2, RATE, 1), (1, RATE // 2, 2), (2, RATE, 3)):
        x = audio(n, samples, seed)
        want = sess.run(None, {"audio": x})[0]
        got = infer_audio(c, model, x)
        assert got.shape == want.shape
        # onnxruntime's FFT runs in float32 and strays from the exact answer
        # in the quiet bands (about 1e-3 of log10 there, more in the natural
        # log without a floor); kiln's runs in double and is held to a
        # float64 computation (numpy's FFT, or onnx's reference evaluator).
        if model == "logmel":
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1.5e-3)
            np.testing.assert_allclose(got, logmel_float64(path, x), rtol=1e-5, atol=2e-5)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-2, atol=2e-2)
            exact = ReferenceEvaluator(str(path)).run(None, {"audio": x})[0]
            np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-3)
    c.close()


TEXTS = [
    ["The striker scored a LATE goal in the final!"],
    ["Inflation worries pushed bond yields and shares lower."],
    ["A security update for the new phone's camera software"],
    ["the and of"],  # stopwords only: no token is left
    ["completely unseen vocabulary here"],
]


def infer_text(client, x):
    inp = httpclient.InferInput("text", list(x.shape), "BYTES")
    inp.set_data_from_numpy(x, binary_data=False)
    r = client.infer("tfidf", [inp])
    return r.as_numpy("label"), r.as_numpy("probabilities")


def test_tfidf_pipeline_matches_onnxruntime(served, repo):
    ops = {(n.domain, n.op_type) for n in onnx.load(str(repo / "tfidf" / "1" / "model.onnx")).graph.node}
    assert {("", "StringNormalizer"), ("com.microsoft", "Tokenizer"), ("", "TfIdfVectorizer")} <= ops, ops
    sess = ort.InferenceSession(str(repo / "tfidf" / "1" / "model.onnx"))
    c = httpclient.InferenceServerClient(served.url)
    batches = [np.array([t], dtype=object) for t in TEXTS] + [np.array(TEXTS[:3], dtype=object)]
    for x in batches + batches[:2]:  # the last two again: plans already built
        want_label, want_prob = sess.run(None, {"text": x})
        label, prob = infer_text(c, x)
        np.testing.assert_array_equal(label.astype(str), want_label.astype(str))
        np.testing.assert_allclose(prob, want_prob, rtol=1e-5, atol=1e-6)
    labels = infer_text(c, np.array(TEXTS[:3], dtype=object))[0].astype(str)
    assert list(labels) == ["sport", "finance", "tech"]
    c.close()


@pytest.mark.parametrize("model", sorted(TOKENIZERS))
def test_tokenizer_matches_onnxruntime(served, repo, model):
    sess = ort.InferenceSession(str(repo / model / "1" / "model.onnx"))
    c = httpclient.InferenceServerClient(served.url)
    for x in (np.array([["Hello, world. It's  a test;ok"], ["a b"]], dtype=object),
              np.array([["déjà vu, encore"]], dtype=object)):
        want = sess.run(None, {"text": x})[0]
        inp = httpclient.InferInput("text", list(x.shape), "BYTES")
        inp.set_data_from_numpy(x, binary_data=True)
        got = c.infer(model, [inp]).as_numpy("tokens")
        assert got.shape == want.shape
        assert [t.decode() for t in got.ravel()] == list(want.ravel())
    c.close()


def test_bad_inputs_are_refused_and_serving_goes_on(served):
    c = httpclient.InferenceServerClient(served.url)
    # Invalid UTF-8 cannot be case-mapped: a 400 naming the node, not a crash.
    inp = httpclient.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"caf\xff"]], dtype=object), binary_data=True)
    with pytest.raises(Exception) as e:
        c.infer("tfidf", [inp])
    assert "UTF-8" in str(e.value), str(e.value)
    # Audio shorter than one frame: STFT says so.
    with pytest.raises(Exception) as e:
        infer_audio(c, "whisper", audio(1, 100, 0))
    assert "frame_length 400" in str(e.value), str(e.value)
    label = infer_text(c, np.array([TEXTS[0]], dtype=object))[0].astype(str)
    assert list(label) == ["sport"]
    c.close()
