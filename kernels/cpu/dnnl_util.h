/* dnnl_util.h - glue between kiln's CPU kernels and oneDNN (C API, 2.x).
 *
 * One CPU engine serves the whole process. A kernel builds its oneDNN
 * primitive in prepare() and wraps it in a struct dnnl_prim, which knows the
 * memory descriptor of every execute argument; run() then only hands raw
 * pointers to dnnl_prim_exec(). A primitive is immutable, so one dnnl_prim
 * may be executed from several threads at once: the per-call objects (a
 * stream and one memory object per argument) live in a small pool of
 * execution contexts that a call claims for its duration, so a steady
 * state allocates nothing. Scratchpads are in user mode: the kernel asks the
 * plan for the bytes and passes its scratch to dnnl_prim_exec().
 *
 * oneDNN here is built on OpenMP: the calling thread's OpenMP thread count
 * is what a primitive uses, and oneDNN sizes its work split when the
 * primitive is created, so prepare and run both go through
 * dnnl_util_set_threads() with the call's nthreads. */
#ifndef KILN_DNNL_UTIL_H
#define KILN_DNNL_UTIL_H

#include <oneapi/dnnl/dnnl.h>

#include "kernels/ops.h"

#define DNNL_PRIM_MAX_ARGS 8

/* Returns the process-wide CPU engine (created on first use, never freed),
 * or NULL when oneDNN cannot make one. Thread-safe. */
dnnl_engine_t dnnl_util_engine(void);

/* Sets the calling thread's OpenMP thread count to n (>= 1) if it differs. */
void dnnl_util_set_threads(int n);

/* Whether oneDNN runs its AVX2 code: an AVX2 CPU without AVX-512, or one
 * capped there by ONEDNN_MAX_CPU_ISA=AVX2 (or AVX2_VNNI). oneDNN's GEMM
 * then rounds some columns of its result differently from the rest: where
 * a block of columns leaves 1-3 over its 6-wide kernel, those go through
 * narrower kernels (measured on oneDNN 2.6; its SSE4.1, AVX and AVX-512
 * GEMMs treat every column alike), so equal columns can differ in their
 * last bit. */
int dnnl_util_isa_avx2(void);

/* Whether oneDNN's int8 kernels have VNNI (AVX512_CORE_VNNI or AVX2_VNNI):
 * int32 sums of u8 x s8 products, exact. Without it they sum pairs of
 * products into int16 with saturation (vpmaddubsw) and halve s8 x s8
 * weights, off ONNX's integer results. 0 as well where AMX is in force
 * (see dnnl_util.c: kiln holds oneDNN below AMX unless told otherwise). */
int dnnl_util_isa_vnni(void);

/* Whether oneDNN's int8 convolution sums x (x_dt) times w (int8, its zero
 * points wz) exactly: weights int8 with zero points 0, and without VNNI
 * (where pairs of u8 x s8 products are summed in int16 with saturation) a
 * uint8 x and every weight within [-64, 64], so no pair sum can saturate.
 * QLinearConv's kernel and the pass that stores its activations NHWC (only
 * oneDNN's kernel reads NHWC) both ask this. */
int dnnl_util_int8_conv_exact(enum dtype x_dt, const struct tensor *w, const struct tensor *wz);

/* The x86-64 level kiln's own vector loops may use, as oneDNN's: 4 (AVX-512
 * F/BW/DQ/VL), 3 (AVX2, FMA) or 2 (SSE4.2, the build's baseline), capped by
 * ONEDNN_MAX_CPU_ISA like oneDNN's code, so the narrower paths are tested
 * on a wide CPU. */
int dnnl_util_isa_level(void);

/* A void function built per level from its always-inline BODY: NAME_v4
 * (AVX-512), NAME_v3 (AVX2), NAME_v2 (the baseline) and NAME, which calls
 * the one for dnnl_util_isa_level(). PARAMS is the parameter list in
 * parentheses, ARGS their names in parentheses. */
#if defined(__x86_64__) && defined(__GNUC__)
#define DNNL_UTIL_ISA_CLONES(NAME, BODY, PARAMS, ARGS)                                                              \
    static void NAME##_v2 PARAMS { BODY ARGS; }                                                                     \
    __attribute__((target("arch=x86-64-v4"))) static void NAME##_v4 PARAMS { BODY ARGS; }                           \
    __attribute__((target("arch=x86-64-v3"))) static void NAME##_v3 PARAMS { BODY ARGS; }                           \
    static void NAME PARAMS {                                                                                       \
        const int level_ = dnnl_util_isa_level();                                                                   \
        if (level_ >= 4) NAME##_v4 ARGS;                                                                            \
        else if (level_ == 3) NAME##_v3 ARGS;                                                                       \
        else NAME##_v2 ARGS;                                                                                        \
    }
#else
#define DNNL_UTIL_ISA_CLONES(NAME, BODY, PARAMS, ARGS) static void NAME PARAMS { BODY ARGS; }
#endif

/* Reports a failed oneDNN call through op_error (naming the call and
 * oneDNN's status) and returns a negative status. */
int dnnl_util_fail(struct op_call *c, const char *call, dnnl_status_t s);

/* Evaluates a oneDNN call; on failure returns dnnl_util_fail() from the
 * enclosing function (which must have `struct op_call *c` in scope). Use
 * only where nothing needs cleaning up; otherwise test DNNL_OK(). */
#define DNNL_CHECK(call)                                                   \
    do {                                                                   \
        dnnl_status_t dnnl_s_ = (call);                                    \
        if (dnnl_s_ != dnnl_success) return dnnl_util_fail(c, #call, dnnl_s_); \
    } while (0)

/* Appends the fused activation (act, a, b) as eltwise post-ops. Returns 1
 * when oneDNN can express it (always so for enum act_kind today), 0 when the
 * caller must apply op_apply_act() itself, negative on a oneDNN failure. */
int dnnl_util_append_act(dnnl_post_ops_t po, enum act_kind act, float a, float b);

/* 1 if oneDNN implements pd with its reference (scalar) loop. */
int dnnl_util_is_ref(const_dnnl_primitive_desc_t pd);
/* Whether oneDNN chose generated code (jit:..., brg...) for pd, not one of its C loops. */
int dnnl_util_is_jit(const_dnnl_primitive_desc_t pd);
/* Fills a plain (dense, row-major) f32 descriptor of the given dims. */
int dnnl_util_plain_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims);
/* Fills an f32 descriptor of the given dims whose layout ("any") the
 * primitive that takes it chooses. */
int dnnl_util_any_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims);
/* A 4-D tensor of these (NCHW) dims stored channels-last (NHWC, oneDNN's
 * acdb), of data type dt; 0 or -1. */
int dnnl_util_nhwc_md(dnnl_memory_desc_t *md, const int64_t *dims, dnnl_data_type_t dt);

/* Creates a primitive attribute in user scratchpad mode (NULL on failure). */
dnnl_primitive_attr_t dnnl_util_attr(void);

/* A primitive plus what it takes to execute it from any thread. */
struct dnnl_prim;

/* Creates the primitive of pd for the execute arguments arg_ids[0..nargs)
 * (DNNL_ARG_SRC...; the scratchpad is added by itself when needed). Sets
 * *scratch_bytes to the scratchpad size. pd stays owned by the caller.
 * Returns NULL after op_error on failure. */
struct dnnl_prim *dnnl_prim_create(struct op_call *c, const_dnnl_primitive_desc_t pd, int nargs,
                                   const int *arg_ids, size_t *scratch_bytes);
/* Binds argument i to a buffer that never changes (weights reordered in
 * prepare): its memory objects are made once with it, because handing
 * oneDNN a new handle may rewrite a blocked buffer's padding. Call before
 * the first dnnl_prim_exec(); ptrs[i] is then ignored. */
void dnnl_prim_bind(struct dnnl_prim *p, int i, void *ptr);
/* Executes with ptrs[i] the buffer of arg_ids[i] (NULL allowed for an
 * argument the primitive ignores) and scratch (at least scratch_bytes,
 * may be NULL when that is 0). Safe to call from several threads at once. */
int dnnl_prim_exec(struct op_call *c, struct dnnl_prim *p, void *const *ptrs, void *scratch);
/* Frees p; NULL is a no-op. Must not race with dnnl_prim_exec(). */
void dnnl_prim_free(struct dnnl_prim *p);

/* Reorders src (layout *src_md) into a new 64-byte aligned buffer of
 * layout *dst_md, once (weights at prepare time). Returns the buffer (free
 * with free()) or NULL after op_error. */
void *dnnl_util_reorder_alloc(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                              const dnnl_memory_desc_t *dst_md);

/* Constant weights in a primitive's layout, shared: the plans of one model
 * at different batch sizes ask for the same bytes (same src pointer and
 * layouts) and get one buffer, reordered by the first and freed with the
 * last (dnnl_util_weights_release). src must stay unchanged while any
 * holder lives, as graph constants do. Thread-safe. NULL after op_error. */
void *dnnl_util_weights_acquire(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                                const dnnl_memory_desc_t *dst_md);
/* The same sharing for a buffer made another way from constant src (a
 * dequantization): on a miss make(c, arg) returns a new buffer (freed with
 * free()) or NULL after op_error; src, src_md and dst_md are the key. */
void *dnnl_util_shared_acquire(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                               const dnnl_memory_desc_t *dst_md, void *(*make)(struct op_call *c, void *arg),
                               void *arg);
/* Drops one hold of a buffer from dnnl_util_weights_acquire or
 * dnnl_util_shared_acquire; NULL is a no-op. */
void dnnl_util_weights_release(void *buf);

/* Rounds n up to a multiple of 64 (scratch sub-allocation). */
static inline size_t dnnl_util_align(size_t n) { return (n + 63) & ~(size_t)63; }

#endif
