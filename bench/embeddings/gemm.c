/* gemm.c - what the products of all-MiniLM-L6-v2 can do on this CPU, for
 * docs/embeddings.md's ceiling: a oneDNN matmul with packed weights (as
 * kiln's MatMul runs a constant B) at the model's three shapes and a range
 * of rows, one thread, and a loop of independent AVX-512 FMAs for the
 * core's peak. Not part of the build:
 *
 *   cc -O2 -mavx512f -o /tmp/gemm bench/embeddings/gemm.c -ldnnl
 *   OMP_NUM_THREADS=1 /tmp/gemm
 *
 * On a shared machine take the best of a few runs. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Twelve independent chains: enough to keep two FMA units busy through
 * their latency. The best of 20 short runs, so that a neighbour's time
 * slice does not count. */
static double fma_peak(void) {
    double best = 0;
    for (int rep = 0; rep < 20; rep++) {
        __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
        __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
               a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
               a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
        long n = 2000000;
        double t0 = now();
        for (long k = 0; k < n; k++) {
#define F(x) x = _mm512_fmadd_ps(x, b, c)
            F(a0); F(a1); F(a2); F(a3); F(a4); F(a5); F(a6); F(a7); F(a8); F(a9); F(a10); F(a11);
#undef F
            __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
        }
        double g = (double)n * 12.0 * 32.0 / (now() - t0) / 1e9;
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(_mm512_add_ps(a6, a7),
                                               _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)))));
        if (_mm512_reduce_add_ps(s) == 1.5f) printf(" ");
        if (g > best) best = g;
    }
    return best;
}

/* GFLOPS of [M, K] x [K, N] with B in oneDNN's preferred layout, or -1. */
static double matmul(dnnl_engine_t eng, dnnl_stream_t st, dnnl_dim_t M, dnnl_dim_t K, dnnl_dim_t N) {
    dnnl_memory_desc_t a, b, bany, c;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_memory_desc_init_by_tag(&a, 2, ad, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b, 2, bd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &a, &bany, NULL, &c) || dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL))
        return -1;
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
    printf("AVX-512 FMA peak, one thread: %.1f GFLOPS\n", fma_peak());
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&st, eng, dnnl_stream_default_flags)) return 1;
    static const dnnl_dim_t rows[] = {16, 64, 256, 512, 1024, 2048};
    static const dnnl_dim_t kn[3][2] = {{384, 384}, {384, 1536}, {1536, 384}};
    printf("rows  384x384  384x1536  1536x384  (GFLOPS)\n");
    for (int i = 0; i < 6; i++) {
        printf("%4lld", (long long)rows[i]);
        for (int j = 0; j < 3; j++) printf("  %7.1f", matmul(eng, st, rows[i], kn[j][0], kn[j][1]));
        printf("\n");
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
