/* dnnl_util.c - oneDNN engine, primitive wrapper and execution contexts. */
#include "kernels/cpu/dnnl_util.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl_debug.h>

#include "common/log.h"

/* ---- engine ------------------------------------------------------------ */

static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) {
        g_engine = NULL;
        log_error("%s: oneDNN could not create a CPU engine", __func__);
        return;
    }
    const dnnl_version_t *v = dnnl_version();
    log_debug("oneDNN %d.%d.%d, CPU runtime %s", v->major, v->minor, v->patch,
             v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP"
             : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
             : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential" : "other");
}

dnnl_engine_t dnnl_util_engine(void) {
    pthread_once(&g_engine_once, engine_init);
    return g_engine;
}

void dnnl_util_set_threads(int n) {
    if (n < 1) n = 1;
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

int dnnl_util_isa_avx2(void) {
    /* The ISA values are nested bit sets: AVX2's bits, without AVX-512's. */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 && (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core &&
           (isa & dnnl_cpu_isa_avx512_mic) != dnnl_cpu_isa_avx512_mic;
}

/* oneDNN 2.6's AMX int8 convolution answered a quantized MobileNetV2
 * (onnxruntime's quantize_static, depthwise and 1x1 convolutions in NHWC)
 * 81 quantization steps away from onnx's reference evaluator, where its
 * AVX512_CORE_VNNI code is exact. Unless ONEDNN_MAX_CPU_ISA chooses, kiln
 * holds oneDNN to the ISA below AMX (float work never runs on AMX); with
 * AMX chosen, quantized convolutions stay float (dnnl_util_isa_vnni). */
__attribute__((constructor)) static void dnnl_util_below_amx(void) {
    if (getenv("ONEDNN_MAX_CPU_ISA") || getenv("DNNL_MAX_CPU_ISA")) return;
    dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16);
}

int dnnl_util_isa_vnni(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx) return 0;
    return (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
           (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
}

int dnnl_util_int8_conv_exact(enum dtype x_dt, const struct tensor *w, const struct tensor *wz) {
    if (!w || w->dtype != DT_INT8 || !w->data) return 0;
    for (int64_t i = 0; wz && i < tensor_numel(wz); i++)
        if (!wz->data || op_double_at(wz, i) != 0) return 0;
    if (dnnl_util_isa_vnni()) return 1;
    if (x_dt != DT_UINT8) return 0;
    const int8_t *wd = w->data;
    for (int64_t i = 0; i < tensor_numel(w); i++)
        if (wd[i] > 64 || wd[i] < -64) return 0;
    return 1;
}

int dnnl_util_isa_level(void) {
    static _Atomic int level; /* 0 until first asked; oneDNN fixes its ISA at its first use */
    int l = atomic_load_explicit(&level, memory_order_relaxed);
    if (l) return l;
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    l = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? 4
        : (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2             ? 3
                                                                     : 2;
    atomic_store_explicit(&level, l, memory_order_relaxed);
    return l;
}

int dnnl_util_fail(struct op_call *c, const char *call, dnnl_status_t s) {
    op_error(c, "oneDNN call failed (%s): %s", dnnl_status2str(s), call);
    return s == dnnl_unimplemented ? STATUS_UNSUPPORTED : s == dnnl_out_of_memory ? STATUS_NOMEM : STATUS_INTERNAL;
}

int dnnl_util_append_act(dnnl_post_ops_t po, enum act_kind act, float a, float b) {
    dnnl_status_t s = dnnl_success;
    switch (act) {
    case ACT_NONE: return 1;
    case ACT_RELU: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f); break;
    case ACT_LEAKY_RELU: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, a, 0.0f); break;
    case ACT_CLIP: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip_v2, a, b); break;
    case ACT_SIGMOID: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_logistic, 0.0f, 0.0f); break;
    case ACT_TANH: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_tanh, 0.0f, 0.0f); break;
    case ACT_GELU: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_erf, 0.0f, 0.0f); break;
    case ACT_HARD_SIGMOID:
        /* oneDNN 2.6 has no hardsigmoid: a*x+b, then clip to [0, 1]. */
        s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, a, b);
        if (s == dnnl_success) s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip_v2, 0.0f, 1.0f);
        break;
    case ACT_HARD_SWISH: /* x * relu6(x + 3) / 6, the same as ONNX HardSwish */
        s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_hardswish, 0.0f, 0.0f);
        break;
    case ACT_SILU: s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_swish, 1.0f, 0.0f); break;
    case ACT_QDQ:
        /* x / a rounded half to even, clipped to the 256 steps, times a
         * (the clip's scale: oneDNN 2.6's jit convolutions apply a second
         * linear post-op with the first one's alpha). oneDNN multiplies by
         * 1 / a where QuantizeLinear divides: the quotients differ by at
         * most one unit in the last place, which moves a value one step only
         * where it lies that close to a half (within the one-step tolerance
         * of the integer convolutions). */
        s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, 1.0f / a, 0.0f);
        if (s == dnnl_success) s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_round, 0.0f, 0.0f);
        if (s == dnnl_success) s = dnnl_post_ops_append_eltwise(po, a, dnnl_eltwise_clip_v2, b, b + 255.0f);
        break;
    default: return 0;
    }
    return s == dnnl_success ? 1 : -1;
}

int dnnl_util_is_ref(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return 0;
    return strncmp(impl, "ref", 3) == 0;
}

int dnnl_util_is_jit(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return 0;
    return strncmp(impl, "jit", 3) == 0 || strncmp(impl, "brg", 3) == 0;
}

int dnnl_util_plain_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims) {
    dnnl_dims_t d, st;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        d[i] = dims[i];
        st[i] = stride;
        stride *= dims[i] > 0 ? dims[i] : 1;
    }
    return dnnl_memory_desc_init_by_strides(md, ndim, d, dnnl_f32, st) == dnnl_success ? 0 : -1;
}

int dnnl_util_nhwc_md(dnnl_memory_desc_t *md, const int64_t *dims, dnnl_data_type_t dt) {
    dnnl_dims_t d;
    for (int i = 0; i < 4; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, 4, d, dt, dnnl_acdb) == dnnl_success ? 0 : -1;
}

int dnnl_util_any_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims) {
    dnnl_dims_t d;
    for (int i = 0; i < ndim; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, ndim, d, dnnl_f32, dnnl_format_tag_any) == dnnl_success ? 0 : -1;
}

dnnl_primitive_attr_t dnnl_util_attr(void) {
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* ---- primitives and execution contexts ---------------------------------- */

/* Enough for the threads that realistically share one plan (instances of
 * a model); a call that finds them all busy builds a temporary context. */
#define CTX_POOL 8

struct exec_ctx {
    dnnl_stream_t stream;
    dnnl_memory_t mem[DNNL_PRIM_MAX_ARGS + 1];
};

struct dnnl_prim {
    dnnl_primitive_t prim;
    int nargs;                                     /* user arguments */
    int arg_ids[DNNL_PRIM_MAX_ARGS + 1];           /* + scratchpad */
    dnnl_memory_desc_t mds[DNNL_PRIM_MAX_ARGS + 1];
    int has_scratch;
    void *fixed[DNNL_PRIM_MAX_ARGS];               /* dnnl_prim_bind() */
    atomic_int busy[CTX_POOL];
    struct exec_ctx ctx[CTX_POOL];
};

static void ctx_destroy(struct exec_ctx *x) {
    for (int i = 0; i <= DNNL_PRIM_MAX_ARGS; i++)
        if (x->mem[i]) dnnl_memory_destroy(x->mem[i]);
    if (x->stream) dnnl_stream_destroy(x->stream);
    memset(x, 0, sizeof *x);
}

/* Makes the stream and memory objects of a context (without buffers). */
static dnnl_status_t ctx_init(struct dnnl_prim *p, struct exec_ctx *x) {
    dnnl_status_t s = dnnl_stream_create(&x->stream, dnnl_util_engine(), dnnl_stream_default_flags);
    if (s != dnnl_success) return s;
    int n = p->nargs + p->has_scratch;
    for (int i = 0; i < n; i++) {
        void *h = i < p->nargs && p->fixed[i] ? p->fixed[i] : DNNL_MEMORY_NONE;
        s = dnnl_memory_create(&x->mem[i], &p->mds[i], dnnl_util_engine(), h);
        if (s != dnnl_success) return s;
    }
    return dnnl_success;
}

struct dnnl_prim *dnnl_prim_create(struct op_call *c, const_dnnl_primitive_desc_t pd, int nargs,
                                   const int *arg_ids, size_t *scratch_bytes) {
    if (nargs > DNNL_PRIM_MAX_ARGS) {
        op_error(c, "internal: %d oneDNN arguments (at most %d)", nargs, DNNL_PRIM_MAX_ARGS);
        return NULL;
    }
    struct dnnl_prim *p = calloc(1, sizeof *p);
    if (!p) {
        op_error(c, "out of memory");
        return NULL;
    }
    p->nargs = nargs;
    for (int i = 0; i < nargs; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg_ids[i]);
        p->arg_ids[i] = arg_ids[i];
        if (md) p->mds[i] = *md;
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sb = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (sb > 0) {
        p->has_scratch = 1;
        p->arg_ids[nargs] = DNNL_ARG_SCRATCHPAD;
        p->mds[nargs] = *smd;
    }
    *scratch_bytes = sb;
    dnnl_status_t s = dnnl_primitive_create(&p->prim, pd);
    if (s != dnnl_success) {
        dnnl_util_fail(c, "dnnl_primitive_create", s);
        free(p);
        return NULL;
    }
    return p;
}

int dnnl_prim_exec(struct op_call *c, struct dnnl_prim *p, void *const *ptrs, void *scratch) {
    struct exec_ctx tmp = {0}, *x = NULL;
    int slot = -1;
    for (int k = 0; k < CTX_POOL; k++) {
        if (atomic_load_explicit(&p->busy[k], memory_order_relaxed) == 0 &&
            atomic_exchange_explicit(&p->busy[k], 1, memory_order_acquire) == 0) {
            slot = k;
            x = &p->ctx[k];
            break;
        }
    }
    if (!x) x = &tmp;
    dnnl_status_t s = dnnl_success;
    if (!x->stream) s = ctx_init(p, x); /* first use of this slot: the slot is ours */
    const char *what = "dnnl_stream_create/dnnl_memory_create";
    dnnl_exec_arg_t args[DNNL_PRIM_MAX_ARGS + 1];
    int n = 0;
    if (s == dnnl_success) {
        what = "dnnl_memory_set_data_handle";
        for (int i = 0; i < p->nargs + p->has_scratch && s == dnnl_success; i++) {
            void *ptr = i < p->nargs ? (p->fixed[i] ? p->fixed[i] : ptrs[i]) : scratch;
            if (!ptr) continue;
            if (i >= p->nargs || !p->fixed[i]) s = dnnl_memory_set_data_handle(x->mem[i], ptr);
            args[n].arg = p->arg_ids[i];
            args[n].memory = x->mem[i];
            n++;
        }
    }
    if (s == dnnl_success) {
        what = "dnnl_primitive_execute";
        dnnl_util_set_threads(c->nthreads);
        s = dnnl_primitive_execute(p->prim, x->stream, n, args);
        if (s == dnnl_success) s = dnnl_stream_wait(x->stream);
    }
    if (slot >= 0) {
        if (s != dnnl_success) ctx_destroy(x); /* rebuilt on next use */
        atomic_store_explicit(&p->busy[slot], 0, memory_order_release);
    } else {
        ctx_destroy(&tmp);
    }
    return s == dnnl_success ? 0 : dnnl_util_fail(c, what, s);
}

void dnnl_prim_bind(struct dnnl_prim *p, int i, void *ptr) {
    if (p && i >= 0 && i < p->nargs) p->fixed[i] = ptr;
}

void dnnl_prim_free(struct dnnl_prim *p) {
    if (!p) return;
    for (int k = 0; k < CTX_POOL; k++) ctx_destroy(&p->ctx[k]);
    if (p->prim) dnnl_primitive_destroy(p->prim);
    free(p);
}

void *dnnl_util_reorder_alloc(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                              const dnnl_memory_desc_t *dst_md) {
    dnnl_engine_t eng = dnnl_util_engine();
    size_t bytes = dnnl_memory_desc_get_size(dst_md);
    void *buf = aligned_alloc(64, dnnl_util_align(bytes ? bytes : 1));
    if (!buf) {
        op_error(c, "out of memory (%zu bytes for reordered weights)", bytes);
        return NULL;
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_stream_t st = NULL;
    const char *what = "dnnl_reorder_primitive_desc_create";
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, src_md, eng, dst_md, eng, NULL);
    if (s == dnnl_success) { what = "dnnl_primitive_create(reorder)"; s = dnnl_primitive_create(&prim, pd); }
    if (s == dnnl_success) { what = "dnnl_memory_create"; s = dnnl_memory_create(&ms, src_md, eng, (void *)src); }
    if (s == dnnl_success) s = dnnl_memory_create(&md, dst_md, eng, buf);
    if (s == dnnl_success) { what = "dnnl_stream_create"; s = dnnl_stream_create(&st, eng, dnnl_stream_default_flags); }
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        what = "dnnl_primitive_execute(reorder)";
        dnnl_util_set_threads(c->nthreads);
        s = dnnl_primitive_execute(prim, st, 2, args);
        if (s == dnnl_success) s = dnnl_stream_wait(st);
    }
    if (st) dnnl_stream_destroy(st);
    if (md) dnnl_memory_destroy(md);
    if (ms) dnnl_memory_destroy(ms);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) {
        free(buf);
        dnnl_util_fail(c, what, s);
        return NULL;
    }
    return buf;
}

/* ---- shared reordered weights ------------------------------------------- */

struct weights_entry {
    const void *src;
    dnnl_memory_desc_t src_md, dst_md;
    void *buf;
    int refs;
    struct weights_entry *next;
};

static pthread_mutex_t g_weights_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weights_entry *g_weights;

/* Called with the lock held. */
static struct weights_entry *weights_find(const void *src, const dnnl_memory_desc_t *src_md,
                                          const dnnl_memory_desc_t *dst_md) {
    for (struct weights_entry *e = g_weights; e; e = e->next)
        if (e->src == src && dnnl_memory_desc_equal(&e->src_md, src_md) && dnnl_memory_desc_equal(&e->dst_md, dst_md))
            return e;
    return NULL;
}

void *dnnl_util_shared_acquire(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                               const dnnl_memory_desc_t *dst_md, void *(*make)(struct op_call *c, void *arg),
                               void *arg) {
    pthread_mutex_lock(&g_weights_lock);
    struct weights_entry *e = weights_find(src, src_md, dst_md);
    if (e) {
        e->refs++;
        pthread_mutex_unlock(&g_weights_lock);
        return e->buf;
    }
    pthread_mutex_unlock(&g_weights_lock);
    /* Made outside the lock: it can take a while for large weights. */
    void *buf = make(c, arg);
    if (!buf) return NULL;
    struct weights_entry *ne = calloc(1, sizeof *ne);
    if (!ne) {
        free(buf);
        op_error(c, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&g_weights_lock);
    if ((e = weights_find(src, src_md, dst_md))) { /* another plan won the race */
        e->refs++;
        pthread_mutex_unlock(&g_weights_lock);
        free(buf);
        free(ne);
        return e->buf;
    }
    ne->src = src;
    ne->src_md = *src_md;
    ne->dst_md = *dst_md;
    ne->buf = buf;
    ne->refs = 1;
    ne->next = g_weights;
    g_weights = ne;
    pthread_mutex_unlock(&g_weights_lock);
    return buf;
}

struct reorder_args {
    const dnnl_memory_desc_t *src_md, *dst_md;
    const void *src;
};

static void *reorder_make(struct op_call *c, void *arg) {
    const struct reorder_args *r = arg;
    return dnnl_util_reorder_alloc(c, r->src_md, r->src, r->dst_md);
}

void *dnnl_util_weights_acquire(struct op_call *c, const dnnl_memory_desc_t *src_md, const void *src,
                                const dnnl_memory_desc_t *dst_md) {
    struct reorder_args r = {src_md, dst_md, src};
    return dnnl_util_shared_acquire(c, src_md, src, dst_md, reorder_make, &r);
}

void dnnl_util_weights_release(void *buf) {
    if (!buf) return;
    pthread_mutex_lock(&g_weights_lock);
    for (struct weights_entry **pp = &g_weights; *pp; pp = &(*pp)->next) {
        struct weights_entry *e = *pp;
        if (e->buf != buf) continue;
        if (--e->refs == 0) {
            *pp = e->next;
            pthread_mutex_unlock(&g_weights_lock);
            free(e->buf);
            free(e);
            return;
        }
        break;
    }
    pthread_mutex_unlock(&g_weights_lock);
}
