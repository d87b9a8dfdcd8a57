"""Models of the set written with onnx.helper and skl2onnx instead of a
torch export, so they build without torch (bench/models/make_set.py imports
this file). Each has the graph its exporter would write: torch.onnx's LSTM
and GRU nodes (gates in ONNX's order, W, R and B as initializers, the
Transpose/Squeeze around them), a CRNN's Conv/MaxPool front with the
Transpose/Reshape into a bidirectional LSTM, a streaming voice-activity
detector's single step with its state as inputs and outputs (as Silero's VAD
is served), and scikit-learn's SVC as skl2onnx converts it.

Weights are seeded (numpy's default_rng by the model's name) and scaled as
torch initialises them (uniform in +-1/sqrt(fan)), so activations keep a
useful range through the recurrences.

A builder returns an onnx.ModelProto; the set's table (make_set.ONNX_BUILT)
gives its inputs and outputs."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _rng(name):
    return np.random.default_rng(sum(map(ord, name)) + 7)


def _uniform(rng, shape, fan):
    b = 1.0 / np.sqrt(fan)
    return rng.uniform(-b, b, shape).astype(np.float32)


class _Graph:
    """A node list with initializers and fresh value names."""

    def __init__(self, name):
        self.name, self.rng = name, _rng(name)
        self.nodes, self.inits, self.k = [], [], 0

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def op(self, op_type, inputs, n_out=1, **attrs):
        self.k += 1
        outs = [f"{op_type.lower()}_{self.k}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self.k}", **attrs))
        return outs[0] if n_out == 1 else outs

    def ints(self, name, values):
        return self.init(f"{name}_{self.k}", np.array(values, np.int64))

    def linear(self, x, n_in, n_out):
        w = self.init(f"fc_w_{self.k}", _uniform(self.rng, (n_in, n_out), n_in))
        b = self.init(f"fc_b_{self.k}", _uniform(self.rng, (n_out,), n_in))
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def rnn(self, kind, x, n_in, hidden, bidirectional=False, h0=None, c0=None):
        """torch's recurrent layer as its exporter writes it: W, R, B with
        the gates in ONNX's order, a GRU with linear_before_reset. Returns
        (Y, Y_h[, Y_c])."""
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
        d = 2 if bidirectional else 1
        w = self.init(f"{kind}_W_{self.k}", _uniform(self.rng, (d, gates * hidden, n_in), hidden))
        r = self.init(f"{kind}_R_{self.k}", _uniform(self.rng, (d, gates * hidden, hidden), hidden))
        b = self.init(f"{kind}_B_{self.k}", _uniform(self.rng, (d, 2 * gates * hidden), hidden))
        inputs = [x, w, r, b, "", h0 or ""] + ([c0 or ""] if kind == "LSTM" else [])
        while inputs and inputs[-1] == "":
            inputs.pop()
        attrs = {"hidden_size": hidden}
        if bidirectional:
            attrs["direction"] = "bidirectional"
        if kind == "GRU":
            attrs["linear_before_reset"] = 1
        return self.op(kind, inputs, n_out=3 if kind == "LSTM" else 2, **attrs)

    def model(self, inputs, outputs):
        g = helper.make_graph(self.nodes, self.name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-make_set")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def _tensor(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def tagger(kind, vocab, emb, hidden, tags):
    """Embedding, one recurrent layer, a per-token classifier: [1, T] token
    ids to [1, T, tags] scores (torch's Embedding -> LSTM/GRU(batch_first)
    -> Linear)."""
    def build(name):
        g = _Graph(name)
        table = g.init("embedding", g.rng.standard_normal((vocab, emb)).astype(np.float32))
        x = g.op("Gather", [table, "input_ids"])                       # [1, T, E]
        x = g.op("Transpose", [x], perm=[1, 0, 2])                      # [T, 1, E]
        y = g.rnn(kind, x, emb, hidden)[0]                              # [T, 1, 1, H]
        y = g.op("Squeeze", [y, g.ints("axis", [1])])                   # [T, 1, H]
        y = g.op("Transpose", [y], perm=[1, 0, 2])                      # [1, T, H]
        g.linear(y, hidden, tags)
        g.nodes[-1].output[0] = "logits"
        return g.model([_tensor("input_ids", TensorProto.INT64, ["batch", "seq"])],
                       [_tensor("logits", TensorProto.FLOAT, ["batch", "seq", tags])])
    return build


def crnn(height=32, width=128, classes=37, hidden=64):
    """A text-line recognizer: two Conv/Relu/MaxPool stages, the feature
    map's columns as a sequence (Transpose, Reshape) into two bidirectional
    LSTMs, a per-column classifier, LogSoftmax (CTC's input)."""
    def build(name):
        g = _Graph(name)
        x, c_in, h = "x", 1, height
        for c_out in (16, 32):
            w = g.init(f"conv_w_{g.k}", _uniform(g.rng, (c_out, c_in, 3, 3), c_in * 9))
            b = g.init(f"conv_b_{g.k}", _uniform(g.rng, (c_out,), c_in * 9))
            x = g.op("Conv", [x, w, b], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            x = g.op("MaxPool", [g.op("Relu", [x])], kernel_shape=[2, 2], strides=[2, 2])
            c_in, h = c_out, h // 2
        feat = c_in * h                                                 # per column
        x = g.op("Transpose", [x], perm=[3, 0, 1, 2])                   # [W', N, C, H']
        x = g.op("Reshape", [x, g.ints("shape", [0, 0, feat])])         # [W', N, C*H']
        n_in = feat
        for _ in range(2):
            y = g.rnn("LSTM", x, n_in, hidden, bidirectional=True)[0]  # [W', 2, N, H]
            y = g.op("Transpose", [y], perm=[0, 2, 1, 3])               # [W', N, 2, H]
            x = g.op("Reshape", [y, g.ints("shape", [0, 0, 2 * hidden])])
            n_in = 2 * hidden
        x = g.linear(x, n_in, classes)                                  # [W', N, classes]
        g.op("LogSoftmax", [x], axis=2)
        g.nodes[-1].output[0] = "log_probs"
        return g.model([_tensor("x", TensorProto.FLOAT, ["batch", 1, height, width])],
                       [_tensor("log_probs", TensorProto.FLOAT, [width // 4, "batch", classes])])
    return build


def vad_step(frame=576, channels=64, hidden=64):
    """One step of a streaming voice-activity detector (Silero-like): a
    strided Conv1d filterbank over the frame, magnitude-ish nonlinearity,
    two Conv1d encoder layers, an LSTM over the frame's few columns carrying
    (h, c) between calls, the last column to a speech probability."""
    def build(name):
        g = _Graph(name)
        x = g.op("Unsqueeze", ["input", g.ints("axes", [1])])          # [N, 1, frame]
        spec = [(1, channels, 64, 32), (channels, channels, 3, 2), (channels, channels, 3, 2)]
        for c_in, c_out, k, s in spec:
            w = g.init(f"conv_w_{g.k}", _uniform(g.rng, (c_out, c_in, k), c_in * k))
            b = g.init(f"conv_b_{g.k}", _uniform(g.rng, (c_out,), c_in * k))
            x = g.op("Relu", [g.op("Conv", [x, w, b], kernel_shape=[k], strides=[s], pads=[k // 2, k // 2])])
        x = g.op("Transpose", [x], perm=[2, 0, 1])                      # [T, N, C]
        y, hn, cn = g.rnn("LSTM", x, channels, hidden, h0="h", c0="c")
        g.nodes[-1].output[1], g.nodes[-1].output[2] = "hn", "cn"
        last = g.op("Gather", [g.op("Squeeze", [y, g.ints("axis", [1])]), g.init("last", np.array(-1, np.int64))],
                    axis=0)                                             # [N, H]
        g.op("Sigmoid", [g.linear(last, hidden, 1)])
        g.nodes[-1].output[0] = "prob"
        return g.model([_tensor("input", TensorProto.FLOAT, ["batch", frame]),
                        _tensor("h", TensorProto.FLOAT, [1, "batch", hidden]),
                        _tensor("c", TensorProto.FLOAT, [1, "batch", hidden])],
                       [_tensor("prob", TensorProto.FLOAT, ["batch", 1]),
                        _tensor("hn", TensorProto.FLOAT, [1, "batch", hidden]),
                        _tensor("cn", TensorProto.FLOAT, [1, "batch", hidden])])
    return build


def svc(features=30, classes=3, samples=600):
    """scikit-learn's SVC (RBF kernel, one-against-one) trained on seeded
    data, converted by skl2onnx without ZipMap: label and per-class scores."""
    def build(name):
        from sklearn.datasets import make_classification
        from sklearn.svm import SVC
        from skl2onnx import to_onnx
        x, y = make_classification(n_samples=samples, n_features=features, n_informative=features // 2,
                                   n_classes=classes, random_state=0)
        clf = SVC(kernel="rbf", gamma="scale", C=1.0).fit(x.astype(np.float32), y)
        m = to_onnx(clf, x[:1].astype(np.float32), options={id(clf): {"zipmap": False}},
                    target_opset={"": OPSET, "ai.onnx.ml": 3})
        # skl2onnx names its input X and its outputs label and probabilities
        # (the decision scores when the SVC has no probability model).
        return m
    return build


def convnext(dims=(24, 48, 96, 192), depths=(1, 1, 2, 1), classes=100, size=160):
    """ConvNeXt as timm writes it and torch.onnx exports it: a 4x4 stride-4
    stem, per stage a downsampling LayerNorm2d and 2x2 stride-2 Conv, and
    blocks of a 7x7 depthwise Conv, the Transpose to channels-last, a
    LayerNormalization over channels, Linear (MatMul, Add), exact GELU (Div,
    Erf, Add, Mul, Mul), Linear, the layer scale Mul, the Transpose back and
    the residual Add; LayerNorm2d is Transpose, LayerNormalization,
    Transpose. Head: global mean, LayerNorm, Linear."""
    def build(name):
        g = _Graph(name)

        def layer_norm(x, c):
            return g.op("LayerNormalization", [x, g.init(f"ln_w_{g.k}", 1 + 0.1 * g.rng.standard_normal(c)
                                                             .astype(np.float32)),
                                               g.init(f"ln_b_{g.k}", 0.1 * g.rng.standard_normal(c).astype(np.float32))],
                        axis=-1, epsilon=1e-6)

        def ln2d(x, c):
            return g.op("Transpose", [layer_norm(g.op("Transpose", [x], perm=[0, 2, 3, 1]), c)], perm=[0, 3, 1, 2])

        def conv(x, c_in, c_out, k, s, group=1, pad=0):
            w = g.init(f"conv_w_{g.k}", _uniform(g.rng, (c_out, c_in // group, k, k), c_in // group * k * k))
            b = g.init(f"conv_b_{g.k}", _uniform(g.rng, (c_out,), c_in // group * k * k))
            return g.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[s, s], group=group, pads=[pad] * 4)

        def gelu(x):
            e = g.op("Erf", [g.op("Div", [x, g.init(f"sqrt2_{g.k}", np.array(1.4142135, np.float32))])])
            half = g.init(f"half_{g.k}", np.array(0.5, np.float32))
            return g.op("Mul", [g.op("Mul", [x, g.op("Add", [e, g.init(f"one_{g.k}", np.array(1, np.float32))])]),
                                half])

        x = ln2d(conv("x", 3, dims[0], 4, 4), dims[0])
        for i, (c, depth) in enumerate(zip(dims, depths)):
            if i:
                x = conv(ln2d(x, dims[i - 1]), dims[i - 1], c, 2, 2)
            for _ in range(depth):
                y = g.op("Transpose", [conv(x, c, c, 7, 1, group=c, pad=3)], perm=[0, 2, 3, 1])
                y = g.linear(gelu(g.linear(layer_norm(y, c), c, 4 * c)), 4 * c, c)
                y = g.op("Mul", [y, g.init(f"gamma_{g.k}", (0.1 + 0.01 * g.rng.standard_normal(c)).astype(np.float32))])
                x = g.op("Add", [x, g.op("Transpose", [y], perm=[0, 3, 1, 2])])
        x = g.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
        g.linear(layer_norm(x, dims[-1]), dims[-1], classes)
        g.nodes[-1].output[0] = "logits"
        return g.model([_tensor("x", TensorProto.FLOAT, ["batch", 3, size, size])],
                       [_tensor("logits", TensorProto.FLOAT, ["batch", classes])])
    return build


def yolov8(width=(12, 24, 48, 80), classes=20, size=160, reg_max=16):
    """A YOLOv8-style detector as ultralytics exports it (opset 17, static
    shape, batch symbolic): Conv blocks of a Conv with its BatchNorm folded
    and SiLU written as Sigmoid and Mul; C2f blocks (a 1x1 Conv, Split in
    two, bottlenecks on the second half with residual Adds, Concat of every
    part, a 1x1 Conv); SPPF (three chained 5x5 MaxPools, Concat); a PAN neck
    (nearest Resize by 2 and Concat up, stride-2 Convs and Concat down); and
    the Detect head: per level a box branch (4 x reg_max channels) and a
    class branch, Concat, Reshape to [b, no, -1], Concat over the levels,
    Split into box and class, DFL (Reshape, Transpose, Softmax, a 1x1 Conv
    with weights 0..reg_max-1, Reshape), the anchors' distances to boxes
    (Slice, Sub, Add, Div, Concat, Mul by the strides) and Sigmoid of the
    classes, Concat into [b, 4 + classes, anchors]."""
    def build(name):
        g = _Graph(name)

        def conv(x, c_in, c_out, k=1, s=1, act=True):
            w = g.init(f"w_{g.k}", _uniform(g.rng, (c_out, c_in, k, k), c_in * k * k) * 1.7)
            b = g.init(f"b_{g.k}", 0.1 * g.rng.standard_normal(c_out).astype(np.float32))
            y = g.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
            return g.op("Mul", [y, g.op("Sigmoid", [y])]) if act else y

        def c2f(x, c_in, c_out, n=1, shortcut=True):
            c = c_out // 2
            a, b = g.op("Split", [conv(x, c_in, 2 * c), g.ints("split", [c, c])], n_out=2, axis=1)
            parts = [a, b]
            for _ in range(n):
                y = conv(conv(parts[-1], c, c, 3), c, c, 3)
                parts.append(g.op("Add", [parts[-1], y]) if shortcut else y)
            return conv(g.op("Concat", parts, axis=1), (2 + n) * c, c_out)

        def sppf(x, c_in, c_out):
            c = c_in // 2
            y = [conv(x, c_in, c)]
            for _ in range(3):
                y.append(g.op("MaxPool", [y[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
            return conv(g.op("Concat", y, axis=1), 4 * c, c_out)

        def up(x):
            scales = g.init(f"scales_{g.k}", np.array([1, 1, 2, 2], np.float32))
            return g.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                        nearest_mode="floor")

        w0, w1, w2, w3 = width
        x = conv("images", 3, w0, 3, 2)                 # /2
        x = conv(x, w0, w1, 3, 2)                       # /4
        x = c2f(x, w1, w1)
        x = conv(x, w1, w2, 3, 2)                       # /8
        p3 = c2f(x, w2, w2, 2)
        x = conv(p3, w2, w3, 3, 2)                      # /16
        p4 = c2f(x, w3, w3, 2)
        x = conv(p4, w3, w3, 3, 2)                      # /32
        p5 = sppf(c2f(x, w3, w3), w3, w3)
        n4 = c2f(g.op("Concat", [up(p5), p4], axis=1), 2 * w3, w3, shortcut=False)
        n3 = c2f(g.op("Concat", [up(n4), p3], axis=1), w3 + w2, w2, shortcut=False)
        d4 = c2f(g.op("Concat", [conv(n3, w2, w2, 3, 2), n4], axis=1), w2 + w3, w3, shortcut=False)
        d5 = c2f(g.op("Concat", [conv(d4, w3, w3, 3, 2), p5], axis=1), 2 * w3, w3, shortcut=False)

        no = 4 * reg_max + classes
        levels, anchors, strides = [], [], []
        for feat, c_in, stride in ((n3, w2, 8), (d4, w3, 16), (d5, w3, 32)):
            c2, c3 = max(16, c_in // 4, 4 * reg_max), max(c_in, min(classes, 100))
            box = conv(conv(conv(feat, c_in, c2, 3), c2, c2, 3), c2, 4 * reg_max, act=False)
            cls = conv(conv(conv(feat, c_in, c3, 3), c3, c3, 3), c3, classes, act=False)
            levels.append(g.op("Reshape", [g.op("Concat", [box, cls], axis=1), g.ints("shape", [0, no, -1])]))
            n = size // stride
            sy, sx = np.meshgrid(np.arange(n, dtype=np.float32) + 0.5, np.arange(n, dtype=np.float32) + 0.5,
                                 indexing="ij")
            anchors.append(np.stack([sx.ravel(), sy.ravel()]))
            strides.append(np.full((1, n * n), stride, np.float32))
        cat = g.op("Concat", levels, axis=2)
        box, cls = g.op("Split", [cat, g.ints("split", [4 * reg_max, classes])], n_out=2, axis=1)
        a = sum(s.shape[1] for s in strides)
        d = g.op("Transpose", [g.op("Reshape", [box, g.ints("shape", [0, 4, reg_max, a])])], perm=[0, 2, 1, 3])
        dfl_w = g.init("dfl_w", np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1))
        d = g.op("Reshape", [g.op("Conv", [g.op("Softmax", [d], axis=1), dfl_w]), g.ints("shape", [0, 4, a])])
        lt = g.op("Slice", [d, g.ints("s", [0]), g.ints("e", [2]), g.ints("ax", [1])])
        rb = g.op("Slice", [d, g.ints("s", [2]), g.ints("e", [4]), g.ints("ax", [1])])
        anc = g.init("anchors", np.concatenate(anchors, axis=1)[None])
        x1y1, x2y2 = g.op("Sub", [anc, lt]), g.op("Add", [anc, rb])
        cxy = g.op("Div", [g.op("Add", [x1y1, x2y2]), g.init("two", np.array(2, np.float32))])
        wh = g.op("Sub", [x2y2, x1y1])
        dbox = g.op("Mul", [g.op("Concat", [cxy, wh], axis=1), g.init("strides", np.concatenate(strides, axis=1))])
        g.op("Concat", [dbox, g.op("Sigmoid", [cls])], axis=1)
        g.nodes[-1].output[0] = "output0"
        return g.model([_tensor("images", TensorProto.FLOAT, ["batch", 3, size, size])],
                       [_tensor("output0", TensorProto.FLOAT, ["batch", 4 + classes, a])])
    return build
