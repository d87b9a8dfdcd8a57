/* prims.c - times oneDNN primitives (f32, NHWC activations, weights in the
 * primitive's layout) with either oneDNN 2.x or 3.x, chosen by the
 * headers it is built against (DNNL_VERSION_MAJOR): bench/onednn.sh builds it
 * twice and compares. Usage: prims THREADS; prints the median us per case. */
#include "dnnl.h"
#include "cases.h"
#if DNNL_VERSION_MAJOR < 3
typedef const dnnl_memory_desc_t *const_dnnl_memory_desc_t;
#endif
static dnnl_engine_t eng; static dnnl_stream_t strm;
#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t MD; /* handle */
static MD mkmd(int nd, const dnnl_dims_t d, dnnl_format_tag_t tag){ MD m; CHECK(dnnl_memory_desc_create_with_tag(&m, nd, d, dnnl_f32, tag)); return m; }
#define MDP(m) (m)
#else
typedef dnnl_memory_desc_t MD;
static MD mkmd(int nd, const dnnl_dims_t d, dnnl_format_tag_t tag){ MD m; CHECK(dnnl_memory_desc_init_by_tag(&m, nd, d, dnnl_f32, tag)); return m; }
#define MDP(m) (&(m))
#endif
static dnnl_memory_t mem(const_dnnl_memory_desc_t md){ dnnl_memory_t m; CHECK(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE)); void*p; dnnl_memory_get_data_handle(m,&p); memset(p,0, dnnl_memory_desc_get_size(md)); return m; }
static double timeit(dnnl_primitive_t p, int nargs, dnnl_exec_arg_t *args, int iters){
    double *t = malloc(sizeof(double)*iters);
    for (int i=0;i<5;i++) CHECK(dnnl_primitive_execute(p, strm, nargs, args));
    for (int i=0;i<iters;i++){ double a=now_us(); CHECK(dnnl_primitive_execute(p, strm, nargs, args)); t[i]=now_us()-a; }
    qsort(t, iters, sizeof(double), cmpd); double r=t[iters/2]; free(t); return r;
}
static dnnl_memory_t reordered(dnnl_memory_t src, const_dnnl_memory_desc_t to){
    dnnl_memory_t dst = mem(to); dnnl_primitive_desc_t rpd; const_dnnl_memory_desc_t smd; dnnl_memory_get_memory_desc(src, &smd);
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, smd, eng, to, eng, NULL)); dnnl_primitive_t r; CHECK(dnnl_primitive_create(&r, rpd));
    dnnl_exec_arg_t a[2]={{DNNL_ARG_FROM,src},{DNNL_ARG_TO,dst}}; CHECK(dnnl_primitive_execute(r,strm,2,a)); dnnl_stream_wait(strm);
    dnnl_primitive_destroy(r); dnnl_primitive_desc_destroy(rpd); return dst;
}
int main(int argc, char **argv){
    int threads = argc > 1 ? atoi(argv[1]) : 1; omp_set_num_threads(threads);
    CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0)); CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        const struct cvcase *k = &CASES[c];
        int oh = (k->h + 2*k->pad - k->k)/k->s + 1, ow = (k->w + 2*k->pad - k->k)/k->s + 1;
        dnnl_dims_t sd={k->n,k->ic,k->h,k->w}, dd={k->n,k->oc,oh,ow}, st={k->s,k->s}, dl={0,0}, pd={k->pad,k->pad};
        MD src=mkmd(4,sd,dnnl_nhwc), dst=mkmd(4,dd,dnnl_nhwc), wany, wplain, bmd; dnnl_dims_t bd={k->oc}; bmd=mkmd(1,bd,dnnl_a);
        if (k->groups > 1) { dnnl_dims_t wd={k->groups,k->oc/k->groups,k->ic/k->groups,k->k,k->k}; wany=mkmd(5,wd,dnnl_format_tag_any); wplain=mkmd(5,wd,dnnl_goihw); }
        else { dnnl_dims_t wd={k->oc,k->ic,k->k,k->k}; wany=mkmd(4,wd,dnnl_format_tag_any); wplain=mkmd(4,wd,dnnl_oihw); }
        dnnl_primitive_desc_t ppd;
#if DNNL_VERSION_MAJOR >= 3
        CHECK(dnnl_convolution_forward_primitive_desc_create(&ppd, eng, dnnl_forward_inference, dnnl_convolution_direct, src, wany, bmd, dst, st, dl, pd, pd, NULL));
#else
        dnnl_convolution_desc_t cd; CHECK(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &src, &wany, &bmd, &dst, st, dl, pd, pd));
        CHECK(dnnl_primitive_desc_create(&ppd, &cd, NULL, eng, NULL));
#endif
        const char *impl; dnnl_primitive_desc_query(ppd, dnnl_query_impl_info_str, 0, &impl);
        const_dnnl_memory_desc_t wq = dnnl_primitive_desc_query_md(ppd, dnnl_query_weights_md, 0);
        dnnl_memory_t ms=mem(MDP(src)), md=mem(MDP(dst)), mb=mem(MDP(bmd)), mw0=mem(MDP(wplain)), mw=reordered(mw0, wq);
        dnnl_primitive_t p; CHECK(dnnl_primitive_create(&p, ppd));
        dnnl_exec_arg_t a[4]={{DNNL_ARG_SRC,ms},{DNNL_ARG_WEIGHTS,mw},{DNNL_ARG_BIAS,mb},{DNNL_ARG_DST,md}};
        printf("%-34s %9.1f us  %s\n", k->name, timeit(p,4,a,200), impl);
    }
    for (size_t c = 0; c < sizeof MM / sizeof *MM; c++) {
        const struct mmcase *k = &MM[c];
        dnnl_dims_t ad={k->m,k->k}, bd={k->k,k->n}, cd2={k->m,k->n};
        MD a=mkmd(2,ad,dnnl_ab), bany=mkmd(2,bd,dnnl_format_tag_any), bpl=mkmd(2,bd,dnnl_ab), cc=mkmd(2,cd2,dnnl_ab);
        dnnl_primitive_desc_t ppd;
#if DNNL_VERSION_MAJOR >= 3
        CHECK(dnnl_matmul_primitive_desc_create(&ppd, eng, a, bany, NULL, cc, NULL));
#else
        dnnl_matmul_desc_t md2; CHECK(dnnl_matmul_desc_init(&md2, &a, &bany, NULL, &cc)); CHECK(dnnl_primitive_desc_create(&ppd, &md2, NULL, eng, NULL));
#endif
        const char *impl; dnnl_primitive_desc_query(ppd, dnnl_query_impl_info_str, 0, &impl);
        const_dnnl_memory_desc_t wq = dnnl_primitive_desc_query_md(ppd, dnnl_query_weights_md, 0);
        dnnl_memory_t ma=mem(MDP(a)), mc=mem(MDP(cc)), mb0=mem(MDP(bpl)), mb=reordered(mb0,wq);
        dnnl_primitive_t p; CHECK(dnnl_primitive_create(&p, ppd));
        dnnl_exec_arg_t args[3]={{DNNL_ARG_SRC,ma},{DNNL_ARG_WEIGHTS,mb},{DNNL_ARG_DST,mc}};
        printf("%-34s %9.1f us  %s\n", k->name, timeit(p,3,args,200), impl);
    }
    return 0;
}
