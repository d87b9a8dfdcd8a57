/* fuzz_cache_value.c - libFuzzer target for what kiln reads back from Redis:
 * the MAC check (cache_value_open), the one decoder of a value
 * (cache_value_view: every view it accepts is checked here against its own
 * promises) and the check and copy of every output against a model
 * (infer_cache's value_to_outputs, which reads that view).
 *
 * Input layout: one byte (bit 0: the model batches; bits 1-7: the request's
 * rows), then the value's bytes. The target seals them with a valid MAC under
 * its own secret and key, as kiln would have, so every input reaches the
 * decoder; the same bytes unsealed must be refused. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c config/model_*.c config/pbtxt.c cache/*.c server/metrics.c
// fuzz-corpus: tests/fuzz/corpus/cache_value/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "server/infer_cache.c" /* value_to_outputs is static */

static cache_t *g_cache;
static struct model_config g_cfg, g_cfg_fixed;

static void make_config(struct model_config *c, int batching) {
    model_config_init(c, "fuzz");
    /* Outputs probs FP32 [N,3], label INT64 [N], names BYTES [N,2]. */
    struct model_io outs[3] = {{.name = "probs", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 3}},
                               {.name = "label", .dtype = DT_INT64, .ndim = 1, .dims = {-1}},
                               {.name = "names", .dtype = DT_STRING, .ndim = 2, .dims = {-1, 2}}};
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}}};
    if (!batching) {
        ins[0].dims[0] = outs[0].dims[0] = outs[1].dims[0] = outs[2].dims[0] = 2;
        c->max_batch_size_set = 1;
    }
    char err[256];
    if (model_config_complete(c, ins, 1, outs, 3, err, sizeof err)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cache) {
        char err[256];
        g_cache = cache_create(&(struct cache_params){.secret = "fuzz"}, err, sizeof err);
        if (!g_cache) abort();
        make_config(&g_cfg, 1);
        make_config(&g_cfg_fixed, 0);
    }
    if (size < 1 || size > (1u << 20)) return 0;
    const struct model_config *mc = data[0] & 1 ? &g_cfg : &g_cfg_fixed;
    int64_t rows = mc->max_batch_size > 0 ? data[0] >> 1 : -1;
    const uint8_t *value = data + 1;
    size_t len = size - 1;
    struct cache_key key = {{0x6b, 0x69, 0x6c, 0x6e}};

    uint8_t *wire = malloc(len + CACHE_MAC_BYTES);
    if (!wire) return 0;
    if (len) memcpy(wire, value, len);
    /* Unsealed (the value's last bytes taken for a MAC): refused, unless the
     * input happens to end in its own MAC, which it cannot without the secret. */
    if (cache_value_open(g_cache, &key, wire, len)) abort();
    cache_value_mac(g_cache, &key, wire, len, wire + len);
    struct cache_value *v = cache_value_open(g_cache, &key, wire, len + CACHE_MAC_BYTES);
    free(wire);
    if (!v) return 0;
    /* What the view promises its reader, who does not check again: names
     * are C strings in the value, bytes lie inside it and match the shape,
     * a BYTES output's bytes are exactly its strings. */
    struct cache_view view;
    if (cache_value_view(v, &view) == 0) {
        const uint8_t *lo = v->data, *hi = v->data + v->len;
        if (view.n < 0 || view.n > CACHE_MAX_OUTPUTS) abort();
        for (int i = 0; i < view.n; i++) {
            const struct cache_view_output *o = &view.out[i];
            const uint8_t *d = o->data, *nm = (const uint8_t *)o->name;
            if (nm < lo || nm + strlen(o->name) >= hi || d < lo || o->len > (size_t)(hi - d)) abort();
            struct tensor t = {.dtype = o->dtype, .ndim = o->ndim};
            memcpy(t.dims, o->dims, sizeof t.dims);
            if (o->dtype == DT_STRING ? tensor_strings_check(d, o->len, tensor_numel(&t), NULL, NULL, 0) != 0
                                      : tensor_nbytes(&t) != o->len)
                abort();
        }
    }
    struct tensor outs[CACHE_MAX_OUTPUTS];
    if (value_to_outputs(v, mc, rows, outs) == 0) {
        /* Touch every byte handed out, as the response encoder would. */
        volatile uint8_t sink = 0;
        for (int i = 0; i < mc->noutputs; i++) {
            if (outs[i].dtype == DT_STRING) {
                const struct tensor_str *sv = tensor_strs(&outs[i]);
                for (int64_t k = 0; k < tensor_numel(&outs[i]); k++)
                    for (size_t j = 0; j < sv[k].len; j++) sink ^= (uint8_t)sv[k].p[j];
            } else {
                const uint8_t *b = outs[i].data;
                for (size_t k = 0; k < tensor_nbytes(&outs[i]); k++) sink ^= b[k];
            }
            free(outs[i].data);
        }
        (void)sink;
    }
    cache_value_unref(v);
    return 0;
}
