"""onnxruntime's contrib operators (domain com.microsoft), served by the real
kiln over HTTP with tritonclient and compared with onnxruntime, the
reference for that domain.

Two kinds of model:
- one node each, made here with onnx.helper, for every operator and the
  attributes and optional inputs and outputs that change its arithmetic;
- real pipelines: the BERT of tests/data/sequence through onnxruntime's
  transformers optimizer (attention fusion off, so it writes
  EmbedLayerNormalization, SkipLayerNormalization and BiasGelu/FastGelu),
  a small convolutional net quantized by onnxruntime.quantization's
  quantize_static in QOperator format, and an MLP whose MatMuls its
  MatMulNBitsQuantizer turns into 4-bit MatMulNBits.

Products of uint8 activations and int8 weights are compared with
onnxruntime running them as uint8 x uint8 (conftest.ort_exact_int8): its
uint8 x int8 product saturates on CPUs without VNNI, kiln's is exact."""
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from onnx import numpy_helper

from conftest import KilnServer, ort_exact_int8

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "tests" / "data" / "sequence" / "bert.onnx"
QUANT = ROOT / "tests" / "data" / "quant"  # tests/models/make_quant_models.py
MS = "com.microsoft"
ELEM = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int32): TP.INT32, np.dtype(np.int64): TP.INT64,
        np.dtype(np.uint8): TP.UINT8, np.dtype(np.int8): TP.INT8, np.dtype(np.uint16): TP.UINT16,
        np.dtype(np.int16): TP.INT16}
TRITON = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
          np.dtype(np.uint8): "UINT8", np.dtype(np.int8): "INT8", np.dtype(np.uint16): "UINT16",
          np.dtype(np.int16): "INT16"}


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def single_node(op, feeds, consts, outputs, domain=MS, **attrs):
    """A model of one node: feeds are graph inputs, consts initializers; an
    input or output named "" is absent; an output is a name (float) or a
    (name, element type) pair."""
    names = list(feeds) + list(consts)
    order = attrs.pop("_inputs", names)
    outputs = [o if isinstance(o, tuple) else (o, TP.FLOAT) for o in outputs]
    node = oh.make_node(op, order, [o for o, _ in outputs], domain=domain, **attrs)
    ins = [oh.make_tensor_value_info(n, ELEM[a.dtype], a.shape) for n, a in feeds.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    outs = [oh.make_tensor_value_info(n, t, None) for n, t in outputs if n]
    graph = oh.make_graph([node], op.lower(), ins, outs, initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


# ---- the single-node cases ------------------------------------------------

def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def case_skip_ln(name, beta=True, bias=True, outputs=("y",), skip_shape=None, simplified=False, eps=None):
    rng = rng_for(name)
    B, S, H = 2, 5, 48
    x = f32(rng, B, S, H)
    skip = f32(rng, *(skip_shape or (B, S, H)))
    consts = {"gamma": f32(rng, H) + 1}
    ins = ["x", "skip", "gamma"]
    if not simplified:
        if beta:
            consts["beta"] = f32(rng, H)
        ins.append("beta" if beta else "")
    if bias:
        consts["bias"] = f32(rng, H)
        ins.append("bias")
    attrs = {} if eps is None else {"epsilon": eps}
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    return single_node(op, {"x": x, "skip": skip}, consts, list(outputs), _inputs=ins, **attrs), {"x": x, "skip": skip}


def case_simplified_ln(name, domain, axis=-1):
    rng = rng_for(name)
    x = f32(rng, 3, 4, 16)
    scale = f32(rng, *x.shape[axis:]) + 1
    m = single_node("SimplifiedLayerNormalization", {"x": x}, {"scale": scale}, ["y"], domain=domain, axis=axis,
                    epsilon=1e-6)
    return m, {"x": x}


def case_embed(name, segment=True, mask=True, position_ids=False, outputs=("y", ("mask_index", TP.INT32))):
    rng = rng_for(name)
    B, S, H, V, P = 3, 7, 32, 50, 16
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    feeds = {"input_ids": ids}
    consts = {}
    if segment:
        feeds["segment_ids"] = rng.integers(0, 2, (B, S)).astype(np.int32)
    consts["word"] = f32(rng, V, H)
    consts["pos"] = f32(rng, P, H)
    if segment:
        consts["seg"] = f32(rng, 2, H)
    consts["gamma"] = f32(rng, H) + 1
    consts["beta"] = f32(rng, H)
    ins = ["input_ids", "segment_ids" if segment else "", "word", "pos", "seg" if segment else "", "gamma", "beta"]
    if mask or position_ids:
        if mask:
            m = np.ones((B, S), np.int32)
            m[1, 4:] = 0
            m[2, 1:] = 0
            feeds["mask"] = m
        ins.append("mask" if mask else "")
    if position_ids:
        feeds["position_ids"] = rng.integers(0, P, (B, S)).astype(np.int32)
        ins.append("position_ids")
    return single_node("EmbedLayerNormalization", feeds, consts, list(outputs), _inputs=ins, epsilon=1e-12), feeds


def case_act(name, op, bias=True, **attrs):
    rng = rng_for(name)
    x = f32(rng, 2, 3, 40, scale=2)
    consts = {"bias": f32(rng, 40)} if bias else {}
    return single_node(op, {"x": x}, consts, ["y"], **attrs), {"x": x}


def case_bias_add(name):
    rng = rng_for(name)
    x, skip = f32(rng, 2, 6, 8), f32(rng, 2, 6, 8)
    m = single_node("BiasAdd", {"x": x, "skip": skip}, {"bias": f32(rng, 8)}, ["y"], _inputs=["x", "bias", "skip"])
    return m, {"x": x, "skip": skip}


def case_fused_matmul(name, a_shape, b_shape, b_const=True, **attrs):
    rng = rng_for(name)
    a, b = f32(rng, *a_shape), f32(rng, *b_shape)
    feeds = {"a": a} if b_const else {"a": a, "b": b}
    consts = {"b": b} if b_const else {}
    return single_node("FusedMatMul", feeds, consts, ["y"], _inputs=["a", "b"], **attrs), feeds


def case_fused_conv(name, z=False, **attrs):
    rng = rng_for(name)
    x = f32(rng, 2, 3, 9, 8)
    consts = {"w": f32(rng, 6, 3, 3, 3, scale=0.3), "b": f32(rng, 6)}
    feeds = {"x": x}
    ins = ["x", "w", "b"]
    if z:
        feeds["z"] = f32(rng, 2, 6, 9, 8)
        ins.append("z")
    m = single_node("FusedConv", feeds, consts, ["y"], _inputs=ins, pads=[1, 1, 1, 1], **attrs)
    return m, feeds


def case_fused_gemm(name, **attrs):
    rng = rng_for(name)
    a = f32(rng, 5, 12)
    consts = {"b": f32(rng, 7, 12), "c": f32(rng, 7)}
    return single_node("FusedGemm", {"a": a}, consts, ["y"], _inputs=["a", "b", "c"], transB=1, **attrs), {"a": a}


def pack_bits(q, bits):
    """Packs the rows of q (values < 2**bits) low bits first, as MatMulNBits stores them."""
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], -1, per).astype(np.uint8)
    out = np.zeros(q.shape[:-1], np.uint8)
    for i in range(per):
        out |= q[..., i] << (i * bits)
    return out


def case_nbits(name, K=72, N=24, bits=4, block=32, zp="packed", bias=False, lead=(2, 3)):
    rng = rng_for(name)
    blocks = -(-K // block)
    q = rng.integers(0, 2 ** bits, (N, blocks, block))
    scales = (rng.random((N, blocks)) * 0.1 + 0.01).astype(np.float32)
    consts = {"B": pack_bits(q, bits), "scales": scales.reshape(-1)}
    ins = ["a", "B", "scales"]
    if zp == "packed":
        z = rng.integers(0, 2 ** bits, (N, -(-blocks * bits // 8) * (8 // bits)))
        consts["zp"] = pack_bits(z, bits).reshape(-1)
        ins.append("zp")
    elif zp == "float":
        consts["zp"] = (rng.random((N * blocks)) * 2 ** bits).astype(np.float32)
        ins.append("zp")
    if bias:
        consts["bias"] = f32(rng, N)
        ins += [""] * (5 - len(ins)) + ["bias"]
    a = f32(rng, *lead, K)
    m = single_node("MatMulNBits", {"a": a}, consts, ["y"], _inputs=ins, K=K, N=N, bits=bits, block_size=block)
    return m, {"a": a}


def case_dynamic_qmm(name, btype=np.int8, per_column=False, zp=True, bias=True):
    rng = rng_for(name)
    K, N = 20, 12
    a = f32(rng, 2, 5, K)
    info = np.iinfo(btype)
    consts = {"B": rng.integers(info.min, info.max + 1, (K, N)).astype(btype),
              "b_scale": (rng.random(N if per_column else 1) * 0.02 + 0.001).astype(np.float32)}
    ins = ["a", "B", "b_scale"]
    if zp:
        consts["b_zp"] = rng.integers(info.min // 4, info.max // 4, N if per_column else 1).astype(btype)
    ins.append("b_zp" if zp else "")
    if bias:
        consts["bias"] = f32(rng, N)
        ins.append("bias")
    return single_node("DynamicQuantizeMatMul", {"a": a}, consts, ["y"], _inputs=ins), {"a": a}


def case_int_to_float(name, atype=np.uint8, btype=np.int8, per_column=True, bias=True):
    rng = rng_for(name)
    K, N = 16, 10
    ai, bi = np.iinfo(atype), np.iinfo(btype)
    a = rng.integers(ai.min, ai.max + 1, (3, 4, K)).astype(atype)
    consts = {"B": rng.integers(bi.min, bi.max + 1, (K, N)).astype(btype),
              "a_scale": np.array([0.03], np.float32),
              "b_scale": (rng.random(N if per_column else 1) * 0.02 + 0.001).astype(np.float32),
              "a_zp": np.array([ai.min // 2 + ai.max // 2 + 3], atype),
              "b_zp": rng.integers(bi.min // 4, bi.max // 4, N if per_column else 1).astype(btype)}
    ins = ["a", "B", "a_scale", "b_scale", "a_zp", "b_zp"]
    if bias:
        consts["bias"] = f32(rng, N)
        ins.append("bias")
    return single_node("MatMulIntegerToFloat", {"a": a}, consts, ["y"], _inputs=ins), {"a": a}


def case_qgemm(name, out_quantized=True, bias=True, transA=0, transB=1, alpha=1.0, per_column=False, atype=np.uint8):
    rng = rng_for(name)
    M, K, N = 6, 24, 10
    ai = np.iinfo(atype)
    a = rng.integers(ai.min, ai.max + 1, (K, M) if transA else (M, K)).astype(atype)
    consts = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(ai.min + 100, atype),
              "B": rng.integers(-127, 128, (N, K) if transB else (K, N)).astype(np.int8),
              "b_scale": (rng.random(N if per_column else 1) * 0.01 + 0.002).astype(np.float32),
              "b_zp": np.zeros(N if per_column else 1, np.int8)}
    ins = ["a", "a_scale", "a_zp", "B", "b_scale", "b_zp"]
    if bias:
        consts["C"] = rng.integers(-2000, 2000, N).astype(np.int32)
    ins.append("C" if bias else "")
    out = "y"
    if out_quantized:
        consts["y_scale"] = np.array(0.05, np.float32)
        consts["y_zp"] = np.array(ai.min + 128, atype)
        ins += ["y_scale", "y_zp"]
        out = ("y", TP.UINT8 if atype == np.uint8 else TP.INT8)
    m = single_node("QGemm", {"a": a}, consts, [out], _inputs=ins, transA=transA, transB=transB, alpha=alpha)
    return m, {"a": a}


def qtensor(rng, shape, dt):
    i = np.iinfo(dt)
    return rng.integers(i.min, i.max + 1, shape).astype(dt)


def qparams(rng, prefix, dt, scale=None, zp=True):
    i = np.iinfo(dt)
    out = {f"{prefix}_scale": np.array(scale or rng.random() * 0.05 + 0.01, np.float32)}
    if zp:
        out[f"{prefix}_zp"] = np.array(rng.integers(i.min // 2, i.max // 2), dt)
    return out


def case_qbinary(name, op, a_shape, b_shape, dt=np.uint8, zp=True):
    rng = rng_for(name)
    a, b = qtensor(rng, a_shape, dt), qtensor(rng, b_shape, dt)
    consts = {**qparams(rng, "a", dt, zp=zp), **qparams(rng, "b", dt, zp=zp), **qparams(rng, "c", dt, zp=zp)}
    ins = ["a", "a_scale", "a_zp" if zp else "", "b", "b_scale", "b_zp" if zp else "", "c_scale", "c_zp" if zp else ""]
    elem = TP.UINT8 if dt == np.uint8 else TP.INT8
    return single_node(op, {"a": a, "b": b}, consts, [("y", elem)], _inputs=ins), {"a": a, "b": b}


def case_qunary(name, op, dt=np.uint8, **attrs):
    rng = rng_for(name)
    x = qtensor(rng, (2, 3, 7), dt)
    consts = {**qparams(rng, "x", dt, scale=0.05), **qparams(rng, "y", dt, scale=0.01)}
    elem = TP.UINT8 if dt == np.uint8 else TP.INT8
    m = single_node(op, {"x": x}, consts, [("y", elem)], _inputs=["x", "x_scale", "x_zp", "y_scale", "y_zp"], **attrs)
    return m, {"x": x}


def case_qconcat(name, dt=np.uint8, axis=1):
    rng = rng_for(name)
    xs = [qtensor(rng, (2, n, 4) if axis == 1 else (2, 4, n), dt) for n in (3, 1, 5)]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    consts = qparams(rng, "y", dt)
    ins = ["y_scale", "y_zp"]
    for i in range(3):
        # the second input shares Y's parameters: copied as it is
        consts.update({f"x{i}_scale": consts["y_scale"], f"x{i}_zp": consts["y_zp"]} if i == 1
                      else qparams(rng, f"x{i}", dt))
        ins += [f"x{i}", f"x{i}_scale", f"x{i}_zp"]
    elem = TP.UINT8 if dt == np.uint8 else TP.INT8
    return single_node("QLinearConcat", feeds, consts, [("y", elem)], _inputs=ins, axis=axis), feeds


def case_qpool(name, op, shape=(2, 3, 9, 8), dt=np.uint8, **attrs):
    rng = rng_for(name)
    x = qtensor(rng, shape, dt)
    consts = {**qparams(rng, "x", dt), **qparams(rng, "y", dt)}
    elem = TP.UINT8 if dt == np.uint8 else TP.INT8
    m = single_node(op, {"x": x}, consts, [("y", elem)], _inputs=["x", "x_scale", "x_zp", "y_scale", "y_zp"], **attrs)
    return m, {"x": x}


def case_qsoftmax(name, shape=(3, 10), dt=np.uint8, **attrs):
    rng = rng_for(name)
    x = qtensor(rng, shape, dt)
    i = np.iinfo(dt)
    consts = {"x_scale": np.array(0.02, np.float32), "x_zp": np.array(i.min + 128, dt),
              "y_scale": np.array(1 / 256, np.float32), "y_zp": np.array(i.min, dt)}
    elem = TP.UINT8 if dt == np.uint8 else TP.INT8
    m = single_node("QLinearSoftmax", {"x": x}, consts, [("y", elem)],
                    _inputs=["x", "x_scale", "x_zp", "y_scale", "y_zp"], **attrs)
    return m, {"x": x}


def case_ms_quantize(name, op, dt, axis=None):
    rng = rng_for(name)
    i = np.iinfo(dt)
    scale = (rng.random(4) * 0.1 + 0.01).astype(np.float32) if axis is not None else np.array(0.05, np.float32)
    zp = rng.integers(i.min // 4, i.max // 4, scale.shape).astype(dt)
    attrs = {} if axis is None else {"axis": axis}
    if op == "QuantizeLinear":
        x = f32(rng, 2, 4, 5, scale=3)
        elem = {np.uint8: TP.UINT8, np.int8: TP.INT8, np.uint16: TP.UINT16, np.int16: TP.INT16}[dt]
        return single_node(op, {"x": x}, {"s": scale, "z": zp}, [("y", elem)], _inputs=["x", "s", "z"], **attrs), {"x": x}
    x = qtensor(rng, (2, 4, 5), dt)
    return single_node(op, {"x": x}, {"s": scale, "z": zp}, ["y"], _inputs=["x", "s", "z"], **attrs), {"x": x}


CASES = {
    "skip_ln": lambda n: case_skip_ln(n),
    "skip_ln_no_beta_no_bias": lambda n: case_skip_ln(n, beta=False, bias=False),
    "skip_ln_bias_no_beta": lambda n: case_skip_ln(n, beta=False),
    "skip_ln_sum_output": lambda n: case_skip_ln(n, outputs=("y", "", "", "sum")),
    "skip_ln_broadcast_skip": lambda n: case_skip_ln(n, skip_shape=(1, 5, 48), eps=1e-5),
    "skip_ln_2d_skip": lambda n: case_skip_ln(n, skip_shape=(5, 48)),
    "skip_simplified_ln": lambda n: case_skip_ln(n, simplified=True, bias=False),
    "skip_simplified_ln_bias": lambda n: case_skip_ln(n, simplified=True),
    "skip_ln_statistics": lambda n: case_skip_ln(n, outputs=("y", "mean", "inv_std_var", "sum")),
    "skip_simplified_ln_sum": lambda n: case_skip_ln(n, simplified=True, bias=False, outputs=("y", "", "", "sum")),
    "simplified_ln_default_domain": lambda n: case_simplified_ln(n, ""),
    "simplified_ln_axis": lambda n: case_simplified_ln(n, "", axis=1),
    "embed_ln": lambda n: case_embed(n),
    "embed_ln_no_segment": lambda n: case_embed(n, segment=False),
    "embed_ln_no_mask": lambda n: case_embed(n, mask=False),
    "embed_ln_position_ids": lambda n: case_embed(n, position_ids=True),
    "embed_ln_position_ids_no_mask": lambda n: case_embed(n, mask=False, position_ids=True),
    "embed_ln_sum_output": lambda n: case_embed(n, outputs=("y", ("mask_index", TP.INT32), "sum")),
    "gelu": lambda n: case_act(n, "Gelu", bias=False),
    "bias_gelu": lambda n: case_act(n, "BiasGelu"),
    "fast_gelu": lambda n: case_act(n, "FastGelu"),
    "fast_gelu_no_bias": lambda n: case_act(n, "FastGelu", bias=False),
    "quick_gelu": lambda n: case_act(n, "QuickGelu", bias=False),
    "quick_gelu_alpha": lambda n: case_act(n, "QuickGelu", bias=False, alpha=1.3),
    "bias_add": case_bias_add,
    "bias_split_gelu": lambda n: case_act(n, "BiasSplitGelu"),
    "fused_matmul": lambda n: case_fused_matmul(n, (3, 5, 8), (8, 6)),
    "fused_matmul_trans_b_alpha": lambda n: case_fused_matmul(n, (3, 5, 8), (6, 8), transB=1, alpha=0.5),
    "fused_matmul_trans_a": lambda n: case_fused_matmul(n, (2, 8, 5), (8, 6), b_const=False, transA=1),
    "fused_matmul_trans_both_batch": lambda n: case_fused_matmul(n, (2, 1, 8, 5), (3, 6, 8), b_const=False,
                                                                 transA=1, transB=1, alpha=2.0),
    "nbits4": lambda n: case_nbits(n),
    "nbits4_no_zp": lambda n: case_nbits(n, zp=None),
    "nbits4_block16_bias": lambda n: case_nbits(n, block=16, bias=True, K=40),
    "nbits4_2d": lambda n: case_nbits(n, K=64, N=8, lead=(5,)),
    "nbits8": lambda n: case_nbits(n, bits=8, block=16),
    "nbits2": lambda n: case_nbits(n, bits=2, block=32, K=64),
    "dynamic_qmm": lambda n: case_dynamic_qmm(n),
    "dynamic_qmm_uint8_per_column": lambda n: case_dynamic_qmm(n, np.uint8, per_column=True),
    "dynamic_qmm_no_zp_no_bias": lambda n: case_dynamic_qmm(n, zp=False, bias=False),
    "int_to_float": lambda n: case_int_to_float(n),
    "int_to_float_u8u8_tensor": lambda n: case_int_to_float(n, btype=np.uint8, per_column=False, bias=False),
    "int_to_float_s8s8": lambda n: case_int_to_float(n, atype=np.int8),
    "qgemm": lambda n: case_qgemm(n),
    "qgemm_float_out": lambda n: case_qgemm(n, out_quantized=False),
    "qgemm_trans_a_alpha_per_column": lambda n: case_qgemm(n, transA=1, transB=0, alpha=0.7, per_column=True),
    "qgemm_no_c": lambda n: case_qgemm(n, bias=False),
    "qgemm_int8": lambda n: case_qgemm(n, atype=np.int8),
    "fused_conv_relu": lambda n: case_fused_conv(n, activation="Relu"),
    "fused_conv_leaky_relu_z": lambda n: case_fused_conv(n, z=True, activation="LeakyRelu", activation_params=[0.2]),
    "fused_conv_clip": lambda n: case_fused_conv(n, activation="Clip", activation_params=[-0.5, 0.5]),
    "fused_conv_sigmoid_strided": lambda n: case_fused_conv(n, activation="Sigmoid", strides=[2, 2]),
    "fused_conv_hard_sigmoid": lambda n: case_fused_conv(n, activation="HardSigmoid", activation_params=[0.3, 0.4]),
    "fused_gemm_relu": lambda n: case_fused_gemm(n, activation="Relu"),
    "fused_gemm_leaky_relu": lambda n: case_fused_gemm(n, activation="LeakyRelu", activation_alpha=0.3, alpha=0.5),
    "fused_gemm_tanh": lambda n: case_fused_gemm(n, activation="Tanh", beta=2.0),
    "qlinear_softmax": lambda n: case_qsoftmax(n, opset=13),
    "qlinear_softmax_axis1": lambda n: case_qsoftmax(n, (2, 6, 5), axis=1, opset=13),
    "qlinear_softmax_opset12": lambda n: case_qsoftmax(n, (2, 3, 4), axis=1, opset=12),
    "qlinear_softmax_int8": lambda n: case_qsoftmax(n, (4, 40), np.int8, opset=13),
    "ms_quantize_uint8": lambda n: case_ms_quantize(n, "QuantizeLinear", np.uint8),
    "ms_quantize_int16_axis": lambda n: case_ms_quantize(n, "QuantizeLinear", np.int16, axis=1),
    "ms_dequantize_uint16_axis": lambda n: case_ms_quantize(n, "DequantizeLinear", np.uint16, axis=1),
    "ms_dequantize_int8": lambda n: case_ms_quantize(n, "DequantizeLinear", np.int8),
    "qlinear_add": lambda n: case_qbinary(n, "QLinearAdd", (2, 3, 8), (2, 3, 8)),
    "qlinear_add_broadcast_int8": lambda n: case_qbinary(n, "QLinearAdd", (2, 3, 8), (3, 1), np.int8),
    "qlinear_add_int8": lambda n: case_qbinary(n, "QLinearAdd", (2, 3, 8), (2, 3, 8), np.int8),
    # same shapes, large enough to be split between threads
    "qlinear_add_large": lambda n: case_qbinary(n, "QLinearAdd", (2, 64, 32, 40), (2, 64, 32, 40)),
    "qlinear_add_large_int8": lambda n: case_qbinary(n, "QLinearAdd", (2, 64, 32, 40), (2, 64, 32, 40), np.int8),
    "qlinear_add_vector": lambda n: case_qbinary(n, "QLinearAdd", (4, 6), (6,)),
    "qlinear_mul": lambda n: case_qbinary(n, "QLinearMul", (2, 3, 8), (1, 3, 8)),
    "qlinear_mul_int8": lambda n: case_qbinary(n, "QLinearMul", (5, 4), (5, 4), np.int8),
    "qlinear_sigmoid": lambda n: case_qunary(n, "QLinearSigmoid"),
    "qlinear_sigmoid_int8": lambda n: case_qunary(n, "QLinearSigmoid", np.int8),
    "qlinear_leaky_relu": lambda n: case_qunary(n, "QLinearLeakyRelu", alpha=0.2),
    "qlinear_leaky_relu_int8": lambda n: case_qunary(n, "QLinearLeakyRelu", np.int8),
    "qlinear_concat": lambda n: case_qconcat(n),
    "qlinear_concat_last_axis_int8": lambda n: case_qconcat(n, np.int8, axis=-1),
    "qlinear_global_avg_pool": lambda n: case_qpool(n, "QLinearGlobalAveragePool"),
    "qlinear_global_avg_pool_nhwc": lambda n: case_qpool(n, "QLinearGlobalAveragePool", channels_last=1),
    "qlinear_global_avg_pool_int8": lambda n: case_qpool(n, "QLinearGlobalAveragePool", dt=np.int8),
    "qlinear_global_avg_pool_nhwc_int8": lambda n: case_qpool(n, "QLinearGlobalAveragePool", shape=(2, 7, 6, 40),
                                                             dt=np.int8, channels_last=1),
    "qlinear_avg_pool": lambda n: case_qpool(n, "QLinearAveragePool", kernel_shape=[3, 3], strides=[2, 2]),
    "qlinear_avg_pool_pads": lambda n: case_qpool(n, "QLinearAveragePool", kernel_shape=[3, 2], pads=[1, 1, 1, 0]),
    "qlinear_avg_pool_pads_counted": lambda n: case_qpool(n, "QLinearAveragePool", kernel_shape=[3, 3],
                                                          pads=[1, 1, 1, 1], count_include_pad=1),
    "qlinear_avg_pool_ceil_same": lambda n: case_qpool(n, "QLinearAveragePool", kernel_shape=[2, 3], strides=[2, 2],
                                                       ceil_mode=1),
    "qlinear_avg_pool_same_upper": lambda n: case_qpool(n, "QLinearAveragePool", kernel_shape=[3, 3], strides=[2, 2],
                                                        auto_pad="SAME_UPPER"),
    "qlinear_avg_pool_nhwc_int8": lambda n: case_qpool(n, "QLinearAveragePool", shape=(2, 7, 6, 4), dt=np.int8,
                                                       kernel_shape=[2, 2], channels_last=1),
    "qlinear_avg_pool_1d": lambda n: case_qpool(n, "QLinearAveragePool", shape=(2, 3, 11), kernel_shape=[4],
                                                strides=[3]),
}

# Tolerances: kiln accumulates a row's statistics in double, onnxruntime in float.
ATOL = {}


def numpy_bias_add(model, feeds):
    bias = numpy_helper.to_array(model.graph.initializer[0])
    return {"y": feeds["x"] + bias + feeds["skip"]}


def numpy_skip_ln_statistics(model, feeds):
    """SkipLayerNormalization's mean and inv_std_var outputs, which onnxruntime's
    CPU kernel leaves out: (B, S, 1) statistics of input + skip + bias."""
    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    s = feeds["x"].astype(np.float64) + feeds["skip"] + p["bias"]
    mean = s.mean(-1, keepdims=True)
    inv = 1 / np.sqrt(((s - mean) ** 2).mean(-1, keepdims=True) + 1e-12)
    y = (s - mean) * inv * p["gamma"] + p["beta"]
    return {k: v.astype(np.float32) for k, v in {"y": y, "mean": mean, "inv_std_var": inv, "sum": s}.items()}


def numpy_bias_split_gelu(model, feeds):
    from math import erf
    v = (feeds["x"] + numpy_helper.to_array(model.graph.initializer[0])).astype(np.float64)
    left, right = np.split(v, 2, axis=-1)
    gelu = 0.5 * right * (1 + np.vectorize(erf)(right / np.sqrt(2)))
    return {"y": (left * gelu).astype(np.float32)}


# Operators or outputs onnxruntime computes on CUDA only: numpy is the reference.
NUMPY = {"bias_add": numpy_bias_add, "bias_split_gelu": numpy_bias_split_gelu, "skip_ln_statistics": numpy_skip_ln_statistics}


def ort_outputs(model, feeds):
    sess = ort.InferenceSession(ort_exact_int8(model).SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def infer(client, name, feeds, outputs):
    ins = []
    for k, v in feeds.items():
        i = httpclient.InferInput(k, list(v.shape), TRITON[v.dtype])
        i.set_data_from_numpy(v, binary_data=True)
        ins.append(i)
    outs = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
    r = client.infer(name, ins, outputs=outs)
    return {o: r.as_numpy(o) for o in outputs}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    repo = tmp_path_factory.mktemp("contrib")
    made = {}
    for name, make in CASES.items():
        model, feeds = make(name)
        d = repo / name / "1"
        d.mkdir(parents=True)
        onnx.save(model, str(d / "model.onnx"))
        made[name] = (model, feeds)
    s = KilnServer(repo)
    c = httpclient.InferenceServerClient(s.url)
    yield made, c
    c.close()
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


@pytest.mark.parametrize("name", list(CASES))
def test_contrib_op_matches_onnxruntime(built, name):
    made, client = built
    model, feeds = made[name]
    want = NUMPY[name](model, feeds) if name in NUMPY else ort_outputs(model, feeds)
    got = infer(client, name, feeds, list(want))
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype in (np.uint8, np.int8, np.uint16, np.int16):  # requantized: one step apart at most (ties)
            assert np.abs(g.astype(np.int32) - w).max() <= 1, (name, k)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=ATOL.get(name, 2e-5), err_msg=f"{name}: {k}")


# ---- real pipelines ---------------------------------------------------------

def serve_one(make_server, tmp_path, name, model):
    d = tmp_path / "repo" / name / "1"
    d.mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    s = make_server(tmp_path / "repo")
    return httpclient.InferenceServerClient(s.url)


@pytest.mark.parametrize("approximate,fp16", [(False, False), (True, False), (False, True)],
                         ids=["bias_gelu", "fast_gelu", "fp16"])
def test_bert_optimized_by_onnxruntime(make_server, tmp_path, approximate, fp16):
    """BertModel through onnxruntime's transformers optimizer without attention
    fusion: SkipLayerNormalization and BiasGelu (FastGelu with the GELU
    approximation) from the optimizer, at two batch sizes and lengths; and the
    optimizer's FP16 conversion (FP32 inputs and outputs), which kiln computes
    in FP32: compared with the FP32 optimized model within FP16's rounding."""
    pytest.importorskip("sympy")  # the optimizer's shape inference needs it
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = FusionOptions("bert")
    opts.enable_attention = False
    opts.enable_gelu_approximation = approximate
    opt = optimize_model(str(BERT), model_type="bert", num_heads=0, hidden_size=0, optimization_options=opts,
                         opt_level=0)
    ops = {(n.domain, n.op_type) for n in opt.model.graph.node}
    gelu = "FastGelu" if approximate else "BiasGelu"
    assert {(MS, "SkipLayerNormalization"), (MS, gelu)} <= ops, ops
    sess = ort.InferenceSession(opt.model.SerializeToString(), providers=["CPUExecutionProvider"])
    if fp16:
        opt.convert_float_to_float16(keep_io_types=True)
    client = serve_one(make_server, tmp_path, "bert_opt", opt.model)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(7)
    for batch, seq in [(1, 9), (3, 16)]:
        feeds = {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
                 "attention_mask": np.ones((batch, seq), np.int64),
                 "token_type_ids": rng.integers(0, 2, (batch, seq)).astype(np.int64)}
        feeds["attention_mask"][-1, seq // 2:] = 0
        want = dict(zip(names, sess.run(None, feeds)))
        got = infer(client, "bert_opt", feeds, names)
        for k in names:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=2e-2 if fp16 else 1e-4, err_msg=k)


def compare_served(client, name, model, feeds_list, quantized_out=False):
    sess = ort.InferenceSession(ort_exact_int8(model).SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for feeds in feeds_list:
        want = dict(zip(names, sess.run(None, feeds)))
        got = infer(client, name, feeds, names)
        for k in names:
            yield k, got[k], want[k]


def test_quantize_static_qoperator(make_server, tmp_path):
    """A small CNN quantized by quantize_static in QOperator format (uint8
    activations, int8 weights, a seeded calibration set): QLinearConv and the
    com.microsoft QLinear ops, QGemm and QLinearSoftmax, served at batch 1 and 4."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(16)])

        def get_next(self):
            return next(self.it, None)

    out = tmp_path / "cnn_q.onnx"
    quantize_static(str(QUANT / "cnn.onnx"), str(out), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    model = onnx.load(str(out))
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    assert {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool",
            "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"} <= ops, ops
    client = serve_one(make_server, tmp_path, "cnn_q", model)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((b, 3, 16, 16)).astype(np.float32)} for b in (1, 4)]
    # Each float output is dequantized from uint8: a tie rounded the other
    # way would move a value by one step of that output's scale (none does on
    # x86-64 today: the answers are equal).
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    step = {n.output[0]: float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "DequantizeLinear"}
    for k, g, w in compare_served(client, "cnn_q", model, feeds):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= step[k] + 1e-6, (k, np.abs(g - w).max(), step[k])


def test_matmul_nbits_quantizer(make_server, tmp_path):
    """A token MLP whose MatMuls onnxruntime's MatMulNBitsQuantizer turned into
    4-bit MatMulNBits (block 32, asymmetric, and symmetric without zero points)."""
    pytest.importorskip("onnx_ir")  # the quantizer's graph library
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((b, t, 64)).astype(np.float32)} for b, t in [(1, 3), (2, 7)]]
    for sym in (False, True):
        q = MatMulNBitsQuantizer(onnx.load(str(QUANT / "mlp.onnx")), block_size=32, is_symmetric=sym)
        q.process()
        model = q.model.model
        nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        assert len(nbits) == 3
        name = f"mlp_{'sym' if sym else 'asym'}"
        client = serve_one(make_server, tmp_path / name, name, model)
        for k, g, w in compare_served(client, name, model, feeds):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=k)


def test_bad_input_is_refused_and_the_server_keeps_serving(built):
    """An embedding id outside its table is a 400 naming the node, the value
    and where it is; the next good request is answered."""
    made, client = built
    model, feeds = made["embed_ln"]
    bad = dict(feeds)
    bad["input_ids"] = feeds["input_ids"].copy()
    bad["input_ids"][1, 2] = 50  # the vocabulary has 50 rows
    with pytest.raises(httpclient.InferenceServerException, match=r"input_ids value 50 at \[1, 2\] is out of range"):
        infer(client, "embed_ln", bad, ["y"])
    bad["input_ids"][1, 2] = -1
    with pytest.raises(httpclient.InferenceServerException, match="out of range"):
        infer(client, "embed_ln", bad, ["y"])
    want = ort_outputs(model, feeds)["y"]
    np.testing.assert_allclose(infer(client, "embed_ln", feeds, ["y"])["y"], want, rtol=1e-4, atol=2e-5)


def test_unsupported_contrib_attributes_are_refused_in_words(make_server, tmp_path):
    """An attribute kiln does not implement is refused with its name, never run wrong."""
    rng = rng_for("unsupported")
    a = f32(rng, 2, 4, 3)
    m = single_node("FusedMatMul", {"a": a}, {"b": f32(rng, 2, 3, 5)}, ["y"], _inputs=["a", "b"], transBatchA=1)
    client = serve_one(make_server, tmp_path, "fmm_batch", m)
    with pytest.raises(httpclient.InferenceServerException, match="transBatchA and transBatchB are not supported"):
        infer(client, "fmm_batch", {"a": a}, ["y"])
    m, feeds = case_fused_conv("elu", activation="Elu")
    client = serve_one(make_server, tmp_path / "elu", "fused_elu", m)
    with pytest.raises(httpclient.InferenceServerException, match="activation 'Elu' is not supported"):
        infer(client, "fused_elu", feeds, ["y"])


def ort_optimized(src, dst):
    """src as onnxruntime saves it after its own graph optimizations (the
    extended level: its contrib fusions, no CPU-specific layouts)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(dst))


@pytest.mark.parametrize("case", ["mlp", "mlp_dynamic", "bert", "cnn"])
def test_onnxruntime_optimized_models(make_server, tmp_path, case):
    """Models as onnxruntime writes them with optimized_model_filepath: its
    fusions into Gelu, BiasGelu, SkipLayerNormalization, FusedMatMul and, after
    quantize_dynamic, DynamicQuantizeMatMul; FusedGemm and FusedConv."""
    src = {"mlp": QUANT / "mlp.onnx", "mlp_dynamic": tmp_path / "mlp_dyn.onnx", "bert": BERT,
           "cnn": QUANT / "cnn.onnx"}[case]
    if case == "mlp_dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic
        quantize_dynamic(str(QUANT / "mlp.onnx"), str(src), weight_type=QuantType.QInt8)
    model = ort_optimized(src, tmp_path / "opt.onnx")
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    want_ops = {"mlp": {"BiasGelu", "SkipLayerNormalization"},
                "mlp_dynamic": {"DynamicQuantizeMatMul", "SkipLayerNormalization"},
                "bert": {"FusedMatMul", "BiasGelu", "FusedGemm"}, "cnn": {"FusedConv"}}[case]
    assert want_ops <= ops, ops
    client = serve_one(make_server, tmp_path, case, model)
    rng = np.random.default_rng(11)
    if case == "bert":
        feeds = [{"input_ids": rng.integers(0, 1000, (b, t)).astype(np.int64), "attention_mask": np.ones((b, t), np.int64),
                  "token_type_ids": np.zeros((b, t), np.int64)} for b, t in [(1, 6), (2, 12)]]
    elif case == "cnn":
        feeds = [{"x": rng.standard_normal((b, 3, 16, 16)).astype(np.float32)} for b in (1, 3)]
    else:
        feeds = [{"x": rng.standard_normal((b, t, 64)).astype(np.float32)} for b, t in [(1, 3), (2, 7)]]
    for k, g, w in compare_served(client, case, model, feeds):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=k)


# ---- DynamicQuantizeLSTM ----------------------------------------------------

def case_dq_lstm(name, direction="bidirectional", wtype=np.int8, per_column=True, lens=(6, 4, 1), with_y=True):
    """A DynamicQuantizeLSTM node as quantize_dynamic writes it (W [D, I, 4H]
    and R [D, H, 4H] transposed, 8-bit; onnxruntime takes zero points 0 for an
    int8 weight and one value for a uint8 one), with sequence_lens and
    initial states."""
    rng = rng_for(name)
    T, B, I, H = 6, len(lens), 10, 16
    D = 2 if direction == "bidirectional" else 1

    def weights(k, dt, per):
        n = 4 * H if per else 1
        scale = ((rng.random((D, n)) * 0.5 + 0.75) / 127).astype(np.float32)
        q = rng.integers(-127, 128, (D, k, 4 * H))
        zp = np.zeros((D, n), np.int64) if dt == np.int8 else np.full((D, n), 120)
        q = (q if dt == np.int8 else q + 128).astype(dt)
        shape = (D, n) if per else (D,)
        return q, scale.reshape(shape), zp.astype(dt).reshape(shape)

    w, ws, wz = weights(I, wtype, per_column)
    r, rs, rz = weights(H, wtype, False)  # onnxruntime: one type for W and R
    feeds = {"x": f32(rng, T, B, I), "seq": np.array(lens, np.int32)}
    consts = {"w": w, "r": r, "b": f32(rng, D, 8 * H, scale=0.2), "h0": f32(rng, D, B, H, scale=0.5),
              "c0": f32(rng, D, B, H, scale=0.5), "ws": ws, "wz": wz, "rs": rs, "rz": rz}
    outputs = ["y" if with_y else "", "yh", "yc"]
    m = single_node("DynamicQuantizeLSTM", feeds, consts, outputs,
                    _inputs=["x", "w", "r", "b", "seq", "h0", "c0", "", "ws", "wz", "rs", "rz"],
                    direction=direction, hidden_size=H)
    return m, feeds


DQ_LSTM = {
    "dq_lstm_bidirectional": lambda n: case_dq_lstm(n),
    "dq_lstm_forward_uint8_no_y": lambda n: case_dq_lstm(n, "forward", np.uint8, lens=(6, 2, 5), with_y=False),
    "dq_lstm_reverse_per_tensor": lambda n: case_dq_lstm(n, "reverse", per_column=False, lens=(3, 6)),
}


@pytest.mark.parametrize("name", list(DQ_LSTM))
def test_dynamic_quantize_lstm_matches_onnxruntime(make_server, tmp_path, name):
    """DynamicQuantizeLSTM against onnxruntime at one thread (at more it may
    quantize the hidden state of each thread's rows apart). Both quantize the
    same floats by the same rule, so they agree to float32 rounding except
    where a value within rounding of a half step of the quantization grid
    rounds the other way: one term of a gate's sum then moves by one grid
    step times one weight. The bound allows a few such flips; at most 2% of
    the elements may be beyond float rounding."""
    model, feeds = DQ_LSTM[name](name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(ort_exact_int8(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    client = serve_one(make_server, tmp_path, name, model)
    got = infer(client, name, feeds, names)
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = feeds["x"]
    step_x = (max(x.max(), 0) - min(x.min(), 0)) / 255
    w_max = np.abs((inits["w"] - inits["wz"].reshape(inits["wz"].shape[0], 1, -1)) *
                   inits["ws"].reshape(inits["ws"].shape[0], 1, -1)).max()
    r_max = np.abs((inits["r"] - inits["rz"].reshape(-1, 1, 1)) * inits["rs"].reshape(-1, 1, 1)).max()
    tol = 4 * max(step_x * w_max, 2 / 255 * r_max)
    for k in names:
        g, w = got[k], want[k]
        assert g.shape == w.shape, (k, g.shape, w.shape)
        err = np.abs(g.astype(np.float64) - w)
        assert err.max() <= tol, (name, k, err.max(), tol)
        assert (err > 1e-5 + 1e-5 * np.abs(w)).mean() <= 0.02, (name, k, (err > 1e-5).mean())


@pytest.mark.parametrize("isa", ["native", "AVX2", "SSE41"])
@pytest.mark.parametrize("op,bias,alpha,last", [
    ("Gelu", False, None, 384), ("BiasGelu", True, None, 384), ("FastGelu", True, None, 384),
    ("FastGelu", False, None, 384), ("QuickGelu", False, 1.702, 384), ("BiasSplitGelu", True, None, 2560),
])
def test_bias_activations_large(tmp_path, op, bias, alpha, last, isa):
    """The bias activations on a tensor large enough to be shared by two
    threads (and BiasSplitGelu's halves longer than the 1024 values its
    kernel takes at a time), at oneDNN's widest ISA and capped at AVX2 and
    SSE4.1, where kiln builds their loops apart: onnxruntime's values (numpy's
    for BiasSplitGelu, which onnxruntime runs on CUDA alone)."""
    import os
    from conftest import kiln_run
    rng = rng_for(f"{op}-{bias}-{last}")
    x = f32(rng, 2, 48, last, scale=3)
    consts = {"bias": f32(rng, last)} if bias else {}
    attrs = {"alpha": alpha} if alpha else {}
    model = single_node(op, {"x": x}, consts, ["y"], **attrs)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    env = {**os.environ, "KILN_STEP_THREADS": "0"}
    if isa != "native":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    (got,) = kiln_run(path, {"x": x}, ["y"], tmp_path, ["--threads", "2"], env)
    ref = numpy_bias_split_gelu if op == "BiasSplitGelu" else ort_outputs  # onnxruntime's CPU lacks it
    want = ref(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
