/* gemm.c - what the products of all-MiniLM-L6-v2 can do on this CPU, for
 * docs/embeddings.md's ceiling: a oneDNN matmul with packed weights (as
 * kiln's MatMul runs a constant B) at the model's three shapes and a range
 * of rows, one thread, and a loop of independent FMAs for the core's peak
 * (AVX-512 where built with it, else AVX2). Beside the matmul, the same
 * product as oneDNN's inner product and as a 1x1 convolution over
 * channels-last rows, both with weights in the layout oneDNN picks: on a
 * CPU without AVX-512, oneDNN runs matmul and inner product through its
 * sgemm (weights left plain, packed on every call) and a 1x1 convolution
 * through its own blocked kernel. Not part of the build:
 *
 *   cc -O2 -march=native -o /tmp/gemm bench/embeddings/gemm.c -ldnnl
 *   OMP_NUM_THREADS=1 /tmp/gemm
 *
 * On a shared machine take the best of a few runs. */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#ifdef __AVX512F__
#define VEC __m512
#define VSET _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VLANES 16
#define ISA "AVX-512"
#else
#define VEC __m256
#define VSET _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
#define VLANES 8
#define ISA "AVX2"
#endif

/* Twelve independent chains: enough to keep two FMA units busy through
 * their latency. The best of 20 short runs, so that a neighbour's time
 * slice does not count. */
static double fma_peak(void) {
    double best = 0;
    for (int rep = 0; rep < 20; rep++) {
        VEC b = VSET(1.0000001f), c = VSET(1e-7f);
        VEC a0 = VSET(0), a1 = VSET(1), a2 = VSET(2), a3 = VSET(3), a4 = VSET(4), a5 = VSET(5), a6 = VSET(6),
            a7 = VSET(7), a8 = VSET(8), a9 = VSET(9), a10 = VSET(10), a11 = VSET(11);
        long n = 2000000;
        double t0 = now();
        for (long k = 0; k < n; k++) {
#define F(x) x = VFMA(x, b, c)
            F(a0); F(a1); F(a2); F(a3); F(a4); F(a5); F(a6); F(a7); F(a8); F(a9); F(a10); F(a11);
#undef F
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
        }
        double g = (double)n * 12.0 * 2.0 * VLANES / (now() - t0) / 1e9;
        VEC s = VADD(VADD(VADD(a0, a1), VADD(a2, a3)),
                     VADD(VADD(a4, a5), VADD(VADD(a6, a7), VADD(VADD(a8, a9), VADD(a10, a11)))));
        float out[VLANES];
        memcpy(out, &s, sizeof out);
        if (out[0] == 1.5f) printf(" ");
        if (g > best) best = g;
    }
    return best;
}

enum kind { MATMUL, INNER_PRODUCT, CONV1X1 };

/* GFLOPS of [M, K] x [K, N] with the weights in oneDNN's preferred
 * layout, run as KIND, or -1 where oneDNN has no such primitive. */
static double product(dnnl_engine_t eng, dnnl_stream_t st, enum kind kind, dnnl_dim_t M, dnnl_dim_t K,
                      dnnl_dim_t N) {
    dnnl_memory_desc_t a, bany, c;
    union {
        dnnl_matmul_desc_t mm;
        dnnl_inner_product_desc_t ip;
        dnnl_convolution_desc_t cv;
    } d;
    dnnl_status_t e;
    if (kind == CONV1X1) { /* rows as the width of one image, channels last */
        dnnl_dims_t ad = {1, K, M}, bd = {N, K, 1}, cd = {1, N, M}, one = {1}, zero = {0};
        dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_acb);
        dnnl_memory_desc_init_by_tag(&bany, 3, bd, dnnl_f32, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&c, 3, cd, dnnl_f32, dnnl_acb);
        e = dnnl_convolution_forward_desc_init(&d.cv, dnnl_forward_inference, dnnl_convolution_direct, &a, &bany,
                                               NULL, &c, one, zero, zero);
    } else if (kind == INNER_PRODUCT) {
        dnnl_dims_t ad = {M, K}, bd = {N, K}, cd = {M, N};
        dnnl_memory_desc_init_by_tag(&a, 2, ad, dnnl_f32, dnnl_ab);
        dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab);
        e = dnnl_inner_product_forward_desc_init(&d.ip, dnnl_forward_inference, &a, &bany, NULL, &c);
    } else {
        dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
        dnnl_memory_desc_init_by_tag(&a, 2, ad, dnnl_f32, dnnl_ab);
        dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab);
        e = dnnl_matmul_desc_init(&d.mm, &a, &bany, NULL, &c);
    }
    dnnl_primitive_desc_t pd;
    if (e || dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL)) return -1;
    const dnnl_memory_desc_t *w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_t p;
    dnnl_memory_t ma, mb, mc;
    dnnl_primitive_create(&p, pd);
    dnnl_memory_create(&ma, &a, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mb, w, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mc, &c, eng, DNNL_MEMORY_ALLOCATE);
    /* Filled, not left as they come: stray denormals would slow it 10-100x. */
    float *pa, *pb;
    dnnl_memory_get_data_handle(ma, (void **)&pa);
    dnnl_memory_get_data_handle(mb, (void **)&pb);
    for (dnnl_dim_t i = 0; i < M * K; i++) pa[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < dnnl_memory_desc_get_size(w) / sizeof(float); i++) pb[i] = (float)(i % 5) * 0.01f;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    dnnl_primitive_execute(p, st, 3, args);
    int reps = (int)(4e9 / (2.0 * (double)(M * K * N))) + 1;
    double t0 = now();
    for (int r = 0; r < reps; r++) dnnl_primitive_execute(p, st, 3, args);
    dnnl_stream_wait(st);
    double t = now() - t0;
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    return 2.0 * (double)(M * K * N) * reps / t / 1e9;
}

int main(void) {
    printf(ISA " FMA peak, one thread: %.1f GFLOPS\n", fma_peak());
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&st, eng, dnnl_stream_default_flags)) return 1;
    static const dnnl_dim_t rows[] = {16, 64, 256, 512, 1024, 2048};
    static const dnnl_dim_t kn[3][2] = {{384, 384}, {384, 1536}, {1536, 384}};
    static const char *names[] = {"matmul", "inner product", "1x1 convolution"};
    for (int k = 0; k < 3; k++) {
        printf("%s\nrows  384x384  384x1536  1536x384  (GFLOPS)\n", names[k]);
        for (int i = 0; i < 6; i++) {
            printf("%4lld", (long long)rows[i]);
            for (int j = 0; j < 3; j++) printf("  %7.1f", product(eng, st, (enum kind)k, rows[i], kn[j][0], kn[j][1]));
            printf("\n");
        }
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
