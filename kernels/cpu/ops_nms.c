/* ops_nms.c - NonMaxSuppression: per batch and class, boxes by falling
 * score, each kept unless it overlaps a kept one by more than the IoU
 * threshold. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * NonMaxSuppression: the selection decides the output's length, so boxes
 * and scores must be known when the plan is built.
 * ------------------------------------------------------------------------ */

struct nms_item {
    float score;
    int64_t idx;
};

static int nms_cmp(const void *pa, const void *pb) {
    const struct nms_item *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->idx < b->idx ? -1 : (a->idx > b->idx);
}

static void nms_corners(const float *bx, int center, float *y0, float *x0, float *y1, float *x1) {
    if (center) {
        *x0 = bx[0] - bx[2] / 2;
        *x1 = bx[0] + bx[2] / 2;
        *y0 = bx[1] - bx[3] / 2;
        *y1 = bx[1] + bx[3] / 2;
    } else {
        *y0 = fminf(bx[0], bx[2]);
        *y1 = fmaxf(bx[0], bx[2]);
        *x0 = fminf(bx[1], bx[3]);
        *x1 = fmaxf(bx[1], bx[3]);
    }
}

/* A kept box as the overlap test reads it: corners and area, computed once
 * (the test runs for every candidate against every kept box). */
struct nms_box {
    float y0, x0, y1, x1, area;
};

static struct nms_box nms_box_of(const float *bx, int center) {
    struct nms_box b;
    nms_corners(bx, center, &b.y0, &b.x0, &b.y1, &b.x1);
    b.area = (b.x1 - b.x0) * (b.y1 - b.y0);
    return b;
}

static inline float nms_max(float a, float b) { return a > b ? a : b; }
static inline float nms_min(float a, float b) { return a < b ? a : b; }

static int nms_suppress(const struct nms_box *a, const struct nms_box *b, float iou_th) {
    float ix0 = nms_max(a->x0, b->x0), ix1 = nms_min(a->x1, b->x1), iy0 = nms_max(a->y0, b->y0),
          iy1 = nms_min(a->y1, b->y1);
    if (ix1 <= ix0 || iy1 <= iy0) return 0;
    float inter = (ix1 - ix0) * (iy1 - iy0), uni = a->area + b->area - inter;
    if (inter <= 0 || a->area <= 0 || b->area <= 0 || uni <= 0) return 0;
    return inter / uni > iou_th;
}

/* Runs the selection, with boxes as center_point_box says; writes the
 * first cap triples to out (if non-NULL) and returns the count, or a
 * negative status. items/kept: scratch of num_boxes entries. */
static int64_t nms_select(struct op_call *c, int center, int64_t *out, int64_t cap, struct nms_item *items,
                          struct nms_box *kept) {
    const struct tensor *boxes = c->in[0], *scores = c->in[1];
    const struct tensor *mo = in_opt(c, 2), *iou = in_opt(c, 3), *sth = in_opt(c, 4);
    int64_t nb = boxes->dims[0], nbox = boxes->dims[1], ncls = scores->dims[1];
    int64_t maxo = mo && tensor_numel(mo) ? op_int_at(mo, 0) : 0;
    float iou_th = iou && tensor_numel(iou) ? (float)op_double_at(iou, 0) : 0;
    int has_sth = sth && tensor_numel(sth);
    float s_th = has_sth ? (float)op_double_at(sth, 0) : 0;
    const float *bx = boxes->data, *sc = scores->data;
    int64_t total = 0;
    if (maxo <= 0) return 0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t k = 0; k < ncls; k++) {
            const float *s = sc + (b * ncls + k) * nbox;
            int64_t n = 0, ns = 0;
            for (int64_t i = 0; i < nbox; i++)
                if (!has_sth || s[i] > s_th) items[n++] = (struct nms_item){s[i], i};
            qsort(items, (size_t)n, sizeof *items, nms_cmp);
            for (int64_t i = 0; i < n && ns < maxo; i++) {
                struct nms_box cand = nms_box_of(bx + (b * nbox + items[i].idx) * 4, center);
                int keep = 1;
                for (int64_t j = 0; j < ns && keep; j++) keep = !nms_suppress(&cand, &kept[j], iou_th);
                if (!keep) continue;
                kept[ns++] = cand;
                if (out && total < cap) {
                    out[total * 3] = b;
                    out[total * 3 + 1] = k;
                    out[total * 3 + 2] = items[i].idx;
                }
                total++;
            }
        }
    return total;
}

static int nms_check(struct op_call *c) {
    int rc;
    if ((rc = need_const(c, 0, "boxes")) || (rc = need_const(c, 1, "scores"))) return rc;
    const struct tensor *boxes = c->in[0], *scores = c->in[1];
    if (boxes->dtype != DT_FP32 || scores->dtype != DT_FP32) return op_error(c, "boxes and scores must be float");
    if (boxes->ndim != 3 || boxes->dims[2] != 4) return op_error(c, "boxes must be [batches, boxes, 4]");
    if (scores->ndim != 3 || scores->dims[0] != boxes->dims[0] || scores->dims[2] != boxes->dims[1])
        return op_error(c, "scores must be [batches, classes, boxes] matching boxes");
    for (int i = 2; i < 5; i++)
        if (in_opt(c, i) && (rc = need_const(c, i, i == 2 ? "max_output_boxes_per_class" : i == 3 ? "iou_threshold" : "score_threshold")))
            return rc;
    return 0;
}

static int nms_infer(struct op_call *c) {
    int rc = nms_check(c);
    if (rc) return rc;
    int64_t nbox = c->in[0]->dims[1] > 0 ? c->in[0]->dims[1] : 1;
    struct nms_item *items = malloc(sizeof *items * (size_t)nbox);
    struct nms_box *kept = malloc(sizeof *kept * (size_t)nbox);
    int center = (int)node_attr_int(c->node, "center_point_box", 0);
    int64_t n = items && kept ? nms_select(c, center, NULL, 0, items, kept) : STATUS_NOMEM;
    free(items);
    free(kept);
    if (n < 0) return (int)n;
    int64_t d[2] = {n, 3};
    return set_shape(c, c->out[0], DT_INT64, 2, d);
}

/* The box format (center_point_box), decoded at prepare. */
struct nms_params {
    int center;
};

static int nms_prepare(struct op_call *c, void **state, size_t *scratch) {
    int rc = nms_check(c);
    if (rc) return rc;
    *scratch = (size_t)(c->in[0]->dims[1] + 1) * (sizeof(struct nms_item) + sizeof(struct nms_box));
    struct nms_params p = {(int)node_attr_int(c->node, "center_point_box", 0)};
    return params_keep(c, &p, sizeof p, state);
}

static int nms_run(struct op_call *c) {
    int64_t nbox = c->in[0]->dims[1];
    if (c->scratch_size < (size_t)(nbox + 1) * (sizeof(struct nms_item) + sizeof(struct nms_box)))
        return op_error(c, "scratch buffer too small");
    struct nms_item *items = c->scratch;
    struct nms_box *kept = (struct nms_box *)(void *)(items + nbox + 1);
    /* The output was sized by infer from the same inputs: one pass writes
     * it, and a different count means they changed since. */
    int center = ((const struct nms_params *)c->state)->center;
    int64_t n = nms_select(c, center, c->out[0]->data, c->out[0]->dims[0], items, kept);
    if (n != c->out[0]->dims[0]) return op_error(c, "the inputs changed since the plan was built");
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_nms[] = {
    {"NonMaxSuppression", "", nms_infer, nms_prepare, nms_run, op_params_free, 0},
    {0},
};
