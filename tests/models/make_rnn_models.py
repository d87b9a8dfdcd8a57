"""Exports PyTorch's recurrent layers to ONNX for tests/e2e/test_rnn_models.py.

    python tests/models/make_rnn_models.py [OUT_DIR]   (default tests/data/rnn)

Needs torch (with its ONNX exporter); nothing is downloaded. For each model
it writes NAME.onnx and NAME.npz: the inputs (in_<input name>) and torch's
outputs (out_<output name>), all from fixed seeds. The three models:
  lstm: nn.LSTM, 2 layers, bidirectional, batch_first, with (h0, c0) given;
  gru:  nn.GRU, bidirectional, with h0 given;
  rnn:  nn.RNN (tanh), 2 layers, with h0 given."""
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

OPSET = 17
SEQ, BATCH, INPUT, HIDDEN = 7, 3, 10, 16


class Wrap(nn.Module):
    """The layer with its states as inputs and outputs (torch takes (h0, c0) as a tuple for an LSTM)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, *states):
        if isinstance(self.layer, nn.LSTM):
            y, (h, c) = self.layer(x, (states[0], states[1]))
            return y, h, c
        y, h = self.layer(x, states[0])
        return y, h


def models():
    torch.manual_seed(0)
    lstm = nn.LSTM(INPUT, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
    gru = nn.GRU(INPUT, HIDDEN, bidirectional=True)
    rnn = nn.RNN(INPUT, HIDDEN, num_layers=2, nonlinearity="tanh")
    state = lambda layers, dirs: torch.randn(layers * dirs, BATCH, HIDDEN)
    yield "lstm", lstm, (torch.randn(BATCH, SEQ, INPUT), state(2, 2), state(2, 2)), ["x", "h0", "c0"], ["y", "hn", "cn"]
    yield "gru", gru, (torch.randn(SEQ, BATCH, INPUT), state(1, 2)), ["x", "h0"], ["y", "hn"]
    yield "rnn", rnn, (torch.randn(SEQ, BATCH, INPUT), state(2, 1)), ["x", "h0"], ["y", "hn"]


def export(out_dir, name, layer, inputs, in_names, out_names):
    model = Wrap(layer).eval()
    with torch.no_grad():
        outputs = model(*inputs)
    path = out_dir / f"{name}.onnx"
    # The TorchScript exporter writes each layer as ONNX's LSTM/GRU/RNN
    # node, which is what is under test; it warns that it is the older one
    # and about batch sizes (the states are inputs here, so that is moot).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), input_names=in_names, output_names=out_names,
                          opset_version=OPSET, dynamo=False)
    arrays = {f"in_{n}": t.numpy() for n, t in zip(in_names, inputs)}
    arrays.update({f"out_{n}": t.numpy() for n, t in zip(out_names, outputs)})
    np.savez(out_dir / f"{name}.npz", **arrays)
    print(f"{path}: {path.stat().st_size} bytes")


def main():
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "data" / "rnn"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, layer, inputs, in_names, out_names in models():
        export(out_dir, name, layer, inputs, in_names, out_names)


if __name__ == "__main__":
    main()
