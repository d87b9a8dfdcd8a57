"""ONNX's pytorch-converted and pytorch-operator model tests (shipped in the
onnx wheel) through `kiln run`: every model kiln accepts must reproduce the
stored outputs; a model kiln refuses must say why in words (unsupported op or
type), never crash."""
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest

from conftest import KILN

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(p for sub in ("pytorch-converted", "pytorch-operator") for p in (DATA / sub).glob("test_*")
               if (p / "model.onnx").exists() and (p / "test_data_set_0").exists())


def load_pb(path):
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return t.name, nh.to_array(t)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_model(case, tmp_path):
    ds = case / "test_data_set_0"
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in init]
    args = [str(KILN), "run", str(case / "model.onnx"), "--output-dir", str(tmp_path), "--quiet"]
    for k, pb in enumerate(sorted(ds.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))):
        args += ["--input", f"{in_names[k]}={pb}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        msg = r.stderr.strip()
        assert r.returncode in (1, 2) and msg, f"kiln run crashed or said nothing: rc={r.returncode}"
        assert any(w in msg for w in ("not supported", "unsupported", "cannot", "refus")), msg
        pytest.skip(msg.splitlines()[-1][:200])
    outs = [o.name for o in model.graph.output]
    for k, pb in enumerate(sorted(ds.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))):
        _, want = load_pb(pb)
        got = np.load(tmp_path / (outs[k].replace("/", "_") + ".npy"), allow_pickle=False)
        assert got.shape == want.shape, (outs[k], got.shape, want.shape)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=outs[k])
        else:
            np.testing.assert_array_equal(got, want, err_msg=outs[k])
