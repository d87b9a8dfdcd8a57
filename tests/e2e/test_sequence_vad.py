"""silero-vad, the voice-activity detector that PyPI's silero-vad wheel
ships as ONNX (an LSTM whose state is an input, `state`, and an output,
`stateN`, and an If on the sample rate `sr`), streamed frame by frame as a
sequence with implicit state: the server keeps `state` between frames. Each
frame's speech probability must equal onnxruntime's, driven the same way
(the state fed back by hand), and once warm the server builds no plan per
frame: only `sr` decides a shape, so only its value is bound in the plans.

The wheel is installed without its dependencies (requirements-dev.txt,
tools/bootstrap.sh): only its ONNX file is read, never its torch code."""
import importlib.util
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import raw_request, serving

SR = 16000
FRAME = 512        # samples per frame at 16 kHz (silero's own step)
CONTEXT = 64       # samples of the previous frame prepended to each (silero's OnnxWrapper)


def silero_onnx():
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        pytest.skip("silero-vad is not installed (tools/bootstrap.sh installs it, --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"
    assert path.exists(), path
    return path


def vad_config(implicit=True):
    """No batch dim (silero's state has its batch axis in the middle):
    every frame runs alone, sequences in parallel on the instances."""
    cfg = {"input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [1, FRAME + CONTEXT]},
                     {"name": "sr", "data_type": "TYPE_INT64", "dims": []}],
           "output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [1, 1]}],
           "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
           "parameters": {"intra_op_thread_count": {"string_value": "1"}}}
    if implicit:
        cfg["sequence_batching"] = {
            "max_sequence_idle_microseconds": 60000000,
            "state": [{"input_name": "state", "output_name": "stateN", "data_type": "TYPE_FP32", "dims": [2, 1, 128]}]}
    return cfg


def make_vad_repo(root):
    """vad (implicit state) and vad_explicit (state sent with each request)."""
    src = silero_onnx()
    for name, implicit in (("vad", True), ("vad_explicit", False)):
        d = Path(root) / name / "1"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, d / "model.onnx")
        cfg = vad_config(implicit)
        if not implicit:
            cfg["input"].append({"name": "state", "data_type": "TYPE_FP32", "dims": [2, 1, 128]})
            cfg["output"].append({"name": "stateN", "data_type": "TYPE_FP32", "dims": [2, 1, 128]})
        (Path(root) / name / "config.json").write_text(json.dumps(cfg))
    return root


def audio(seed, frames):
    """Deterministic test audio that silero hears as speech in places: a
    voiced sound (harmonics of a gliding pitch shaped by three formants) in
    syllables, and pauses of faint noise."""
    rng = np.random.default_rng(seed)
    n = frames * FRAME
    t = np.arange(n) / SR
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.9 * t + seed)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = np.zeros(n)
    for h in range(1, 30):
        fh = h * f0
        amp = (np.exp(-((fh - 700) / 300) ** 2) + 0.6 * np.exp(-((fh - 1200) / 400) ** 2)
               + 0.3 * np.exp(-((fh - 2500) / 500) ** 2))
        x += amp * np.sin(h * phase) / h ** 0.3
    syllables = (np.sin(2 * np.pi * 3.5 * t) > 0) * (np.sin(2 * np.pi * 0.4 * t + seed) > -0.2)
    return (0.2 * x * syllables + 0.003 * rng.standard_normal(n)).astype(np.float32)


def windows(x):
    """The model's inputs: each frame with the previous frame's last 64 samples before it."""
    ctx = np.zeros(CONTEXT, np.float32)
    out = []
    for k in range(len(x) // FRAME):
        f = x[k * FRAME:(k + 1) * FRAME]
        out.append(np.concatenate([ctx, f])[None, :])
        ctx = f[-CONTEXT:]
    return out


def ort_probs(path, frames):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    probs = []
    for w in frames:
        out, state = s.run(None, {"input": w, "state": state, "sr": np.array(SR, np.int64)})
        probs.append(float(out.ravel()[0]))
    return probs


@pytest.fixture(scope="module")
def vad_srv(tmp_path_factory):
    root = make_vad_repo(tmp_path_factory.mktemp("vad") / "repo")
    yield from serving(root)


def stream_http(c, mod, seq_id, frames, model="vad"):
    probs = []
    for k, w in enumerate(frames):
        x = mod.InferInput("input", list(w.shape), "FP32")
        x.set_data_from_numpy(w)
        sr = mod.InferInput("sr", [], "INT64")
        sr.set_data_from_numpy(np.array(SR, np.int64))
        r = c.infer(model, [x, sr], sequence_id=seq_id, sequence_start=k == 0, sequence_end=k == len(frames) - 1)
        probs.append(float(r.as_numpy("output").ravel()[0]))
    return probs


def plan_builds(srv, model):
    m = raw_request(srv.url, "GET", "/metrics")[2].decode()
    for ln in m.splitlines():
        if ln.startswith(f'kiln_plan_builds{{model="{model}"'):
            return int(float(ln.split()[-1]))
    raise AssertionError(f"no kiln_plan_builds for {model}")


def test_vad_stream_equals_onnxruntime_http(vad_srv):
    import tritonclient.http as httpclient
    path = silero_onnx()
    frames = windows(audio(1, 60))
    want = ort_probs(path, frames)
    assert max(want) > 0.5 and min(want) < 0.05, "the test audio should have speech and silence"
    c = httpclient.InferenceServerClient(vad_srv.url)
    got = stream_http(c, httpclient, 11, frames)
    np.testing.assert_allclose(got, want, atol=2e-4)
    # Warm: another stream of new audio builds no plan, frame after frame.
    before = plan_builds(vad_srv, "vad")
    frames2 = windows(audio(2, 40))
    got = stream_http(c, httpclient, 12, frames2)
    np.testing.assert_allclose(got, ort_probs(path, frames2), atol=2e-4)
    assert plan_builds(vad_srv, "vad") == before
    c.close()


def test_vad_streams_grpc_concurrent(vad_srv):
    """8 streams at once over gRPC's streaming RPC, frames interleaved on one
    stream: each stream's probabilities are onnxruntime's for its audio."""
    import queue

    import tritonclient.grpc as grpcclient
    path = silero_onnx()
    streams = {300 + i: windows(audio(10 + i, 20)) for i in range(8)}
    want = {sid: ort_probs(path, f) for sid, f in streams.items()}
    c = grpcclient.InferenceServerClient(vad_srv.grpc_url())
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    n = 0
    for k in range(20):
        for sid, frames in streams.items():
            x = grpcclient.InferInput("input", list(frames[k].shape), "FP32")
            x.set_data_from_numpy(frames[k])
            sr = grpcclient.InferInput("sr", [], "INT64")
            sr.set_data_from_numpy(np.array(SR, np.int64))
            c.async_stream_infer("vad", [x, sr], request_id=f"{sid}:{k}", sequence_id=sid, sequence_start=k == 0,
                                 sequence_end=k == 19)
            n += 1
    got = {sid: [None] * 20 for sid in streams}
    for _ in range(n):
        result, error = answers.get(timeout=120)
        assert error is None, error
        sid, k = map(int, result.get_response().id.split(":"))
        got[sid][k] = float(result.as_numpy("output").ravel()[0])
    c.stop_stream()
    c.close()
    for sid in streams:
        np.testing.assert_allclose(got[sid], want[sid], atol=2e-4)


def stream_explicit(c, frames, state=None):
    """Frames as plain requests to vad_explicit, the state sent and taken
    back by the client; returns (probabilities, last state)."""
    import tritonclient.http as httpclient
    state = np.zeros((2, 1, 128), np.float32) if state is None else state
    probs = []
    for w in frames:
        x = httpclient.InferInput("input", list(w.shape), "FP32")
        x.set_data_from_numpy(w)
        sr = httpclient.InferInput("sr", [], "INT64")
        sr.set_data_from_numpy(np.array(SR, np.int64))
        s = httpclient.InferInput("state", [2, 1, 128], "FP32")
        s.set_data_from_numpy(state)
        r = c.infer("vad_explicit", [x, sr, s])
        probs.append(float(r.as_numpy("output").ravel()[0]))
        state = r.as_numpy("stateN")
    return probs, state


def test_vad_explicit_state_same_answers(vad_srv):
    """The same frames with the state sent and returned by the client (a
    plain model, no sequence): the same probabilities, and no plan per frame
    either once warm."""
    import tritonclient.http as httpclient
    path = silero_onnx()
    frames = windows(audio(3, 30))
    c = httpclient.InferenceServerClient(vad_srv.url)
    first, state = stream_explicit(c, frames[:5])
    before = plan_builds(vad_srv, "vad_explicit")
    rest, _ = stream_explicit(c, frames[5:], state)
    np.testing.assert_allclose(first + rest, ort_probs(path, frames), atol=2e-4)
    assert plan_builds(vad_srv, "vad_explicit") == before
    c.close()


def test_vad_explicit_concurrent(vad_srv):
    """8 clients at once, each streaming its own audio with the state sent
    back and forth: the two instances run the same plan side by side (its If
    node's prepared state is the plan's: models/control.c runs one at a
    time)."""
    import tritonclient.http as httpclient
    path = silero_onnx()
    streams = {i: windows(audio(20 + i, 20)) for i in range(8)}
    got, errors = {}, []

    def worker(i):
        try:
            c = httpclient.InferenceServerClient(vad_srv.url)
            got[i] = stream_explicit(c, streams[i])[0]
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in streams]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    for i, frames in streams.items():
        np.testing.assert_allclose(got[i], ort_probs(path, frames), atol=2e-4)
