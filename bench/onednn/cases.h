/* cases.h - the primitives bench/onednn/prims.c times: shapes from the
 * real-model set (depthwise, 1x1 and 3x3 convolutions in NHWC, the matmuls
 * of BERT-class encoders). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now_us(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmpd(const void*a,const void*b){double x=*(const double*)a,y=*(const double*)b; return x<y?-1:x>y;}
#define CHECK(x) do { dnnl_status_t s_ = (x); if (s_ != dnnl_success) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1);} } while (0)
struct cvcase { const char *name; int n, ic, oc, h, w, k, s, pad, groups; };
static const struct cvcase CASES[] = {
    {"dw3x3 144@56 (mobilenet_v2)", 1, 144, 144, 56, 56, 3, 1, 1, 144},
    {"dw3x3 672@14 s1", 1, 672, 672, 14, 14, 3, 1, 1, 672},
    {"1x1 112->672 @14 (mobilenet_v3)", 1, 112, 672, 14, 14, 1, 1, 0, 1},
    {"1x1 24->72 @56", 1, 24, 72, 56, 56, 1, 1, 0, 1},
    {"3x3 64->64 @56 (resnet)", 1, 64, 64, 56, 56, 3, 1, 1, 1},
    {"3x3 256->256 @14 (resnet)", 1, 256, 256, 14, 14, 3, 1, 1, 1},
    {"3x3 64->64 @56 batch 8", 8, 64, 64, 56, 56, 3, 1, 1, 1},
};
struct mmcase { const char *name; int m, k, n; };
static const struct mmcase MM[] = {
    {"matmul 128x768x768 (BERT-base)", 128, 768, 768},
    {"matmul 128x768x3072", 128, 768, 3072},
    {"matmul 1x960x1280", 1, 960, 1280},
    {"matmul 64x128x512 (small BERT)", 64, 128, 512},
};
