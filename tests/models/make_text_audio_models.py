#!/usr/bin/env python3
"""Exports the preprocessing models that the signal and string operators are
tested on end to end:

  logmel.onnx  a Whisper-style log-mel spectrogram in torch (torch.stft with a
               Hann window, centred with reflection padding, power spectrum,
               an 80-band mel filter bank, log10, dynamic-range clamp and
               scaling), exported with torch.onnx: audio [batch, samples] ->
               log_mel [batch, 80, frames]
  tfidf.onnx   a scikit-learn text classifier, TfidfVectorizer (lower-casing,
               English stopwords, unigrams and bigrams) into
               LogisticRegression, converted with skl2onnx: text [N, 1]
               strings -> label, probabilities

Both are small and kept in tests/data/text_audio/ so that the tests need
neither torch nor scikit-learn; run this again (pip install torch
scikit-learn skl2onnx) to remake them.

Usage: make_text_audio_models.py [--out tests/data/text_audio]
"""
import argparse
import os

import numpy as np

N_FFT, HOP, N_MELS, RATE = 400, 160, 80, 16000

CORPUS = [
    ("the match ended with a late goal from the striker", "sport"),
    ("our team won the cup after extra time", "sport"),
    ("the coach praised the defence and the goalkeeper", "sport"),
    ("a record crowd watched the final at the stadium", "sport"),
    ("the central bank raised interest rates again", "finance"),
    ("shares fell as investors worried about inflation", "finance"),
    ("the company reported higher quarterly profits", "finance"),
    ("bond yields rose after the budget announcement", "finance"),
    ("the new phone has a faster chip and a better camera", "tech"),
    ("the software update fixes a security flaw", "tech"),
    ("researchers released an open source language model", "tech"),
    ("the laptop battery lasts a full day of work", "tech"),
]


def mel_filters():
    """An HTK-style triangular filter bank [N_MELS, N_FFT/2 + 1]."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, RATE / 2, N_FFT // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0), hz_to_mel(RATE / 2), N_MELS + 2))
    fb = np.zeros((N_MELS, N_FFT // 2 + 1), dtype=np.float32)
    for m in range(N_MELS):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        up = (freqs - lo) / (mid - lo)
        down = (hi - freqs) / (hi - mid)
        fb[m] = np.maximum(0, np.minimum(up, down))
    return fb


def export_logmel(path):
    import torch

    class LogMel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("window", torch.hann_window(N_FFT))
            self.register_buffer("filters", torch.from_numpy(mel_filters()))

        def forward(self, audio):
            spec = torch.stft(audio, N_FFT, HOP, window=self.window, center=True, pad_mode="reflect",
                              return_complex=False)
            power = spec[..., 0] ** 2 + spec[..., 1] ** 2
            mel = self.filters @ power[:, :, :-1]
            log_spec = torch.clamp(mel, min=1e-10).log10()
            log_spec = torch.maximum(log_spec, log_spec.amax(dim=(1, 2), keepdim=True) - 8.0)
            return (log_spec + 4.0) / 4.0

    audio = torch.randn(2, RATE)
    torch.onnx.export(LogMel().eval(), (audio,), path, input_names=["audio"], output_names=["log_mel"],
                      dynamic_axes={"audio": {0: "batch", 1: "samples"}, "log_mel": {0: "batch", 2: "frames"}},
                      opset_version=17, dynamo=False)


def export_tfidf(path):
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    text = np.array([t for t, _ in CORPUS], dtype=object).reshape(-1, 1)
    labels = np.array([c for _, c in CORPUS])
    pipe = Pipeline([("tfidf", TfidfVectorizer(ngram_range=(1, 2), stop_words="english")),
                     ("lr", LogisticRegression(max_iter=1000))])
    pipe.fit(text.ravel(), labels)
    # C.UTF-8 is on every Debian machine; onnxruntime refuses a locale that
    # is not installed (its default is en_US.UTF-8).
    m = to_onnx(pipe, initial_types=[("text", StringTensorType([None, 1]))],
                options={id(pipe): {"zipmap": False}, id(pipe.steps[0][1]): {"locale": "C.UTF-8"}},
                target_opset={"": 17, "ai.onnx.ml": 3})
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "text_audio"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    export_logmel(os.path.join(a.out, "logmel.onnx"))
    export_tfidf(os.path.join(a.out, "tfidf.onnx"))


if __name__ == "__main__":
    main()
