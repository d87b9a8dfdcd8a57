"""silero-vad, the voice-activity detector that PyPI's silero-vad wheel
ships as ONNX (an LSTM whose state is an input, `state`, and an output,
`stateN`, and an If on the sample rate `sr`), streamed frame by frame as a
sequence with implicit state: the server keeps `state` between frames. Each
frame's speech probability must equal onnxruntime's, driven the same way
(the state fed back by hand), and once warm the server builds no plan per
frame: only `sr` decides a shape, so only its value is bound in the plans.

The wheel is installed without its dependencies (requirements-dev.txt,
tools/bootstrap.sh): only its ONNX file is read, never its torch code."""
import sys
import threading

import numpy as np
import pytest

from conftest import ROOT, raw_request, serving

sys.path.insert(0, str(ROOT / "bench"))
from vad_stream import SR, audio, make_vad_repo, ort_session, windows  # noqa: E402 (bench/ holds the shared part)
from vad_stream import ort_probs as _ort_probs  # noqa: E402
from vad_stream import silero_onnx as _silero_onnx  # noqa: E402


def silero_onnx():
    path = _silero_onnx()
    if path is None:
        pytest.skip("silero-vad is not installed (tools/bootstrap.sh installs it, --no-deps)")
    assert path.exists(), path
    return path


def ort_probs(path, frames):
    return _ort_probs(ort_session(path), frames)


@pytest.fixture(scope="module")
def vad_srv(tmp_path_factory):
    root = make_vad_repo(tmp_path_factory.mktemp("vad") / "repo", silero_onnx())
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
    node's executors are the plan's: models/control.c gives each run a lane
    of its own)."""
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
