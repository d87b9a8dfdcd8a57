/* passes.h - load-time rewrites of a graph, run once by model_load.
 *
 * Each pass keeps the graph valid and topologically ordered, logs at debug
 * level what it changed, and returns 0 or a negative status with a message.
 * Values a pass makes unreachable are left in the value table (unused) and
 * their constant data is freed by passes_eliminate_dead. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stddef.h>

#include "graph/graph.h"

/* Runs every pass below in order: fold constants, eliminate dead nodes,
 * fold BatchNormalization into Conv, fold per-channel Mul/Add into Conv or
 * BatchNormalization, fuse MatMul/Gemm/Conv + Add(bias), fuse activations,
 * eliminate dead nodes again. */
int passes_run(struct graph *g, char *err, size_t err_len);
/* passes_run, and with cpu_only (every plan of the graph runs on the CPU)
 * the fusions into operators only the CPU kernels have. */
int passes_run_for(struct graph *g, int cpu_only, char *err, size_t err_len);

/* Evaluates, on the CPU, every node whose inputs are all constants (Constant
 * nodes included) and turns its outputs into constant values. A node whose
 * kernel refuses is left in place (it will fail, with its message, if run).
 * Returns the number of nodes folded through *nfolded if non-NULL. */
int passes_fold_constants(struct graph *g, int *nfolded, char *err, size_t err_len);

/* Replaces each If whose condition is a constant by the nodes of the
 * branch it takes (renamed apart under the If's name), so that a shape
 * check or an export-time switch costs nothing at run time. Returns the
 * number of If nodes replaced through *ninlined if non-NULL. */
int passes_inline_if(struct graph *g, int *ninlined, char *err, size_t err_len);

/* Removes nodes none of whose outputs reach a graph output, and frees the
 * data of constants that no remaining node reads. */
int passes_eliminate_dead(struct graph *g, int *nremoved);

/* Conv -> BatchNormalization (constant scale, bias, mean, var; the Conv's
 * output read by the BN only) becomes one Conv with new weights and bias. */
int passes_fold_conv_bn(struct graph *g, int *nfolded, char *err, size_t err_len);

/* Conv or BatchNormalization -> Mul/Add/Sub/Div by a constant scalar or
 * per-channel vector (the Conv/BN output read by it alone): folded into the
 * Conv's weights and bias or the BN's scale and bias. */
int passes_fold_affine(struct graph *g, int *nfolded, char *err, size_t err_len);

/* MatMul (OP_BIAS_INPUT) -> Add(constant bias over the last dim) becomes
 * MatMul with a kiln-internal third input; Gemm without C -> Add(constant
 * [N] or [1,N]) takes the bias as C; Conv without bias -> Add(constant
 * [1,M,1,1] or [M,1,1]) takes it as its bias. */
int passes_fuse_bias(struct graph *g, int *nfused, char *err, size_t err_len);

/* Conv/Gemm/MatMul (OP_FUSE_ACT) -> Relu, LeakyRelu, Clip (constant bounds),
 * Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu (exact) becomes node->act on
 * the producer when the intermediate value has one reader and is not a
 * graph output. */
/* x * 0.5 * (1 + erf(x / sqrt(2))) as exporters write it -> one Gelu node. */
int passes_fuse_gelu(struct graph *g, int *nfused, char *err, size_t err_len);
int passes_fuse_activations(struct graph *g, int *nfused, char *err, size_t err_len);
/* CPU only, after passes_fuse_activations: a float Conv with a fused
 * activation whose output only a Mul by a scalar constant, then an Add of
 * one (either or both), reads -> node->act_affine (PaddleOCR's learnable
 * affine blocks after HardSwish). */
int passes_fuse_post_affine(struct graph *g, int *nfused, char *err, size_t err_len);
/* 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) as GPT-2's
 * exports write it (Pow, four Muls, two Adds, Tanh) -> one Gelu with
 * approximate="tanh" (CPU; passes_gelu_tanh.c). */
int passes_fuse_gelu_tanh(struct graph *g, int *nfused, char *err, size_t err_len);
/* x * Clip(x + 3, 0, 6) / 6 and x * HardSigmoid(x, 1/6, 0.5), hard-swish as
 * Paddle2ONNX and older torch exports write it -> one HardSwish node (CPU;
 * passes_hardswish.c). */
int passes_fuse_hardswish(struct graph *g, int *nfused, char *err, size_t err_len);
/* ReduceMean(Pow(x, 2)) -> Add(eps) -> Sqrt -> Div(1, .) -> Mul(x, .) ->
 * Mul(w, .), T5's and Llama's RMSNorm as exported -> one RMSNormalization
 * (CPU; passes_rmsnorm.c). */
int passes_fuse_rmsnorm(struct graph *g, int *nfused, char *err, size_t err_len);
/* CPU only: x * Sigmoid(x) (SiLU) where x, the output of a Conv, Gemm or
 * MatMul, is read by the Sigmoid and the Mul alone: ACT_SILU on x's
 * producer, which takes the Mul's output. */
int passes_fuse_silu(struct graph *g, int *nfused, char *err, size_t err_len);
/* [scale] -> [Add mask] -> Softmax -> [Where(IsNaN)], the softmax of exported
 * attention, into one kiln.MaskedSoftmax node (CPU). */
int passes_fuse_masked_softmax(struct graph *g, int *nfused, char *err, size_t err_len);
/* MatMul -> [scalar factor] -> Softmax(last axis) -> MatMul with no mask
 * and nothing else reading the scores: one kiln.SoftmaxAttention node
 * (kernels/cpu/ops_attention.c). CPU only. */
int passes_fuse_softmax_attention(struct graph *g, int *nfused, char *err, size_t err_len);
/* BERT's masked attention with its heads' Transposes, after
 * passes_fuse_masked_softmax: one kiln.HeadAttention node (CPU). */
int passes_fuse_head_attention(struct graph *g, int *nfused, char *err, size_t err_len);

/* DequantizeLinear -> op -> QuantizeLinear, as onnxruntime.quantization's
 * QDQ format writes a quantized model, becomes the integer op on the 8-bit
 * values (CPU): Conv [+ Relu/Clip] -> QLinearConv with the activation
 * fused, Add -> QLinearAdd, GlobalAveragePool -> QLinearGlobalAveragePool
 * (com.microsoft), and MaxPool, Flatten, Reshape between equal scales run on
 * the 8-bit values. Within one quantization step of the float graph. */
int passes_fuse_qdq(struct graph *g, int *nfused, char *err, size_t err_len);
/* CPU only, after passes_fuse_activations: a float Conv whose output only
 * an 8-bit per-tensor QuantizeLinear reads, whose output only a
 * DequantizeLinear of the same scale and zero point reads (the QDQ models
 * where oneDNN has no exact int8 convolution: AVX2) -> ACT_QDQ on the Conv,
 * which takes the DequantizeLinear's output: one pass over the activation
 * where there were three. A fused Relu or Clip goes when the quantization's
 * own clip contains it. */
int passes_fuse_fake_quant(struct graph *g, int *nfused, char *err, size_t err_len);
/* DynamicQuantizeLinear -> MatMulInteger (constant 2-D weights) -> Cast ->
 * Mul(x_scale * w_scale) [-> Add(bias)], as onnxruntime.quantization's
 * quantize_dynamic writes a MatMul, becomes one com.microsoft
 * MatMulIntegerToFloat (CPU), or DynamicQuantizeMatMul when the
 * DynamicQuantizeLinear serves that product alone (passes_dynq.c). The
 * same integer sums and float operations: the same results. */
int passes_fuse_dynq(struct graph *g, int *nfused, char *err, size_t err_len);
/* After passes_fuse_qdq: the 8-bit activations that flow only between
 * 2-D QLinearConvs and QLinearAdds are stored NHWC (oneDNN's int8 layout),
 * their dims unchanged; the nodes' kiln_layout attribute says so. Returns
 * the number of nodes marked through *nnhwc. */
int passes_qdq_layout(struct graph *g, int *nnhwc, char *err, size_t err_len);

/* CPU only, last: float activations between 2-D Convs and the operators
 * that can carry them (activations, Add/Mul/Sub/Div, pools, channel
 * Concat, spatial Resize) are stored channels-last, their dims unchanged;
 * the nodes' kiln_layout attribute says so (see passes_layout.c). Returns
 * the number of nodes marked through *nmarked. KILN_LAYOUT=plain turns it
 * off (for measurements). */
int passes_layout(struct graph *g, int *nmarked, char *err, size_t err_len);

/* CPU only, after passes_layout: Conv -> Add(Y, Z) of Y's shape, Y and Z
 * stored alike, becomes the Conv with Z as input 3 (kiln_residual 1),
 * summed by the convolution, the Add's activation moved to it. Returns
 * the number fused through *nfused. KILN_RESIDUAL=0 turns it off. */
int passes_fuse_residual(struct graph *g, int *nfused, char *err, size_t err_len);

/* 1 if node a is an activation kiln can fuse exactly (Relu, LeakyRelu,
 * Clip with constant bounds, Sigmoid, Tanh, HardSigmoid, HardSwish, exact
 * Gelu), with its kind and parameters; 0 otherwise. */
int passes_activation_of(const struct graph *g, const struct graph_node *a, enum act_kind *kind, float *alpha,
                         float *beta);

#endif
