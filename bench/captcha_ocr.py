"""ddddocr's default OCR model (common_old.onnx in the ddddocr wheel, pinned in
requirements-bench.txt: quantize_dynamic's ConvInteger, DynamicQuantizeLinear,
MatMulInteger and a bidirectional DynamicQuantizeLSTM) through kiln and
onnxruntime at one thread: a captcha-like line drawn with PIL and
preprocessed as ddddocr does (grey, height 64, /255, (x - 0.5) / 0.5), the
outputs compared and both timed in alternating rounds.

    .venv-bench/bin/python bench/captcha_ocr.py [--rounds 3] [--iterations 50]

The model is read from the installed package's folder without importing it
(its import wants OpenCV)."""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_path():
    spec = importlib.util.find_spec("ddddocr")
    if spec is None:
        sys.exit("ddddocr is not installed here: .venv-bench/bin/pip install --no-deps ddddocr==1.6.1 "
                 "(requirements-bench.txt)")
    return os.path.join(spec.submodule_search_locations[0], "common_old.onnx")


def captcha():
    img = Image.new("L", (160, 64), 235)
    d = ImageDraw.Draw(img)
    rng = np.random.default_rng(1)
    for i, ch in enumerate("k7Qm2x"):
        d.text((8 + 24 * i, 20 + int(rng.integers(-6, 7))), ch, fill=int(rng.integers(0, 80)))
    for _ in range(6):
        d.line([tuple(rng.integers(0, 160, 2)), tuple(rng.integers(0, 64, 2))], fill=120)
    return ((np.asarray(img, np.float32) / 255.0 - 0.5) / 0.5)[None, None]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    a = ap.parse_args()
    model, x = model_path(), captcha()
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"input1": x})[0]
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "input1.npy"), x)
        cmd = [a.kiln, "run", model, "--input", f"input1={tmp}/input1.npy", "--threads", "1", "--output-dir", tmp]
        subprocess.run(cmd + ["--quiet"], check=True)
        got = np.load(os.path.join(tmp, sess.get_outputs()[0].name + ".npy"))
        err = np.abs(got.astype(np.float64) - want)
        print(f"outputs {want.shape}: max |kiln - onnxruntime| {err.max():.3g} (max |onnxruntime| "
              f"{np.abs(want).max():.3g}); best class per column equal: {(got.argmax(-1) == want.argmax(-1)).mean():.3f}")
        kiln, ortt = [], []
        for _ in range(a.rounds):
            out = subprocess.run(cmd + ["--quiet", "--iterations", str(a.iterations)], check=True, capture_output=True,
                                 text=True).stdout
            kiln.append(float(re.search(r"p50 ([0-9.]+) ms", out).group(1)))
            t = []
            for _ in range(a.iterations):
                t0 = time.perf_counter()
                sess.run(None, {"input1": x})
                t.append(time.perf_counter() - t0)
            ortt.append(float(np.median(t)) * 1e3)
    k, o = float(np.median(kiln)), float(np.median(ortt))
    print(f"1 thread, median of {a.rounds} rounds of p50 over {a.iterations}: kiln {k:.2f} ms, onnxruntime "
          f"{ort.__version__} {o:.2f} ms, kiln / onnxruntime {k / o:.2f}")


if __name__ == "__main__":
    main()
