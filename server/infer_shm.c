/* infer_shm.c - a request's tensors in shared memory. See infer_shm.h. */
#include "server/infer_shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

/* Input in: its bytes from the region it names, checked against its shape
 * and data type before any is read. */
static int resolve_input(struct kserve_input *in, const char *model, shm_registry_t *reg, shm_owner_t owner, char *err,
                         size_t err_len) {
    char what[300], sh[128];
    snprintf(what, sizeof what, "input '%s'", in->name);
    struct kserve_shm *s = &in->shm;
    struct tensor *t = &in->t;
    if (t->dtype != DT_STRING) {
        int64_t numel = tensor_numel(t);
        size_t need = numel == INT64_MAX ? SIZE_MAX : tensor_nbytes(t);
        if (need != s->byte_size) /* Triton's words first: its clients' tests match them */
            return INVALID("input byte size mismatch for input '%s' for model '%s'. Expected %zu, got %llu "
                           "(shared_memory_byte_size; shape %s of %s)", in->name, model, need,
                           (unsigned long long)s->byte_size, tensor_shape_str(t, sh, sizeof sh),
                           dtype_kserve_name(t->dtype));
    }
    s->ref = shm_acquire(reg, owner, s->region, s->offset, s->byte_size, what, &s->addr, err, err_len);
    if (!s->ref) return STATUS_INVALID;
    if (t->dtype == DT_STRING) {
        /* Parsed from a private copy: the client may write the region while
         * it is read, and the lengths must not change between the check of
         * the buffer and the copy of the strings. */
        char why[160];
        void *copy = malloc((size_t)s->byte_size + 1);
        if (!copy) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        int rc = shm_region_read(s->ref, s->addr, copy, (size_t)s->byte_size, err, err_len);
        if (rc) {
            free(copy);
            return rc;
        }
        rc = tensor_strings_from_prefixed(t, copy, (size_t)s->byte_size, why, sizeof why);
        free(copy);
        if (rc == STATUS_INVALID)
            return INVALID("%s of shape %s in shared memory region '%s': %s", what, tensor_shape_str(t, sh, sizeof sh),
                           s->region, why);
        return rc;
    }
    /* Always copied, never used in place: the model's reads of the client's
     * mapping would be outside the SIGBUS guard (a truncated object would
     * kill the server), and the client could change the bytes while the
     * model reads them. The request owns the copy, and either backend takes
     * it as any input; a CUDA region is copied from the device the same way. */
    if (tensor_alloc_data(t)) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    return shm_region_read(s->ref, s->addr, t->data, (size_t)s->byte_size, err, err_len);
}

int infer_shm_resolve(struct kserve_request *r, const char *model, shm_registry_t *reg, shm_owner_t owner, char *err,
                      size_t err_len) {
    char what[300];
    for (int i = 0; i < r->ninputs; i++) {
        if (!r->inputs[i].shm.region) continue;
        int rc = resolve_input(&r->inputs[i], model, reg, owner, err, err_len);
        if (rc) return rc;
    }
    for (int i = 0; i < r->noutputs; i++) {
        struct kserve_shm *s = &r->outputs[i].shm;
        if (!s->region) continue;
        snprintf(what, sizeof what, "output '%s'", r->outputs[i].name);
        s->ref = shm_acquire(reg, owner, s->region, s->offset, s->byte_size, what, &s->addr, err, err_len);
        if (!s->ref) return STATUS_INVALID;
    }
    return 0;
}

int infer_shm_write_outputs(const struct kserve_request *r, const struct model_config *mc,
                            const struct tensor *outputs, char *err, size_t err_len) {
    char sh[128];
    for (int i = 0; i < r->noutputs; i++) {
        const struct kserve_output *o = &r->outputs[i];
        if (!o->shm.ref) continue;
        int k = model_config_find_output(mc, o->name);
        if (k < 0) return INVALID("unexpected inference output '%s' for model '%s'", o->name, mc->name);
        const struct tensor *t = &outputs[k];
        size_t n = t->dtype == DT_STRING ? tensor_strings_prefixed_size(t) : tensor_nbytes(t);
        if (n > o->shm.byte_size)
            return INVALID("output '%s': shared_memory_byte_size is %llu but the output (shape %s of %s) needs %zu bytes "
                           "in shared memory region '%s'", o->name, (unsigned long long)o->shm.byte_size,
                           tensor_shape_str(t, sh, sizeof sh), dtype_kserve_name(t->dtype), n, o->shm.region);
        if (t->dtype != DT_STRING) {
            int rc = shm_region_write(o->shm.ref, o->shm.addr, t->data, n, err, err_len);
            if (rc) return rc;
        } else { /* laid out apart, then copied in under the guard (shm.h) */
            void *buf = malloc(n ? n : 1);
            if (!buf) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
            tensor_strings_prefixed_write(t, buf);
            int rc = shm_region_write(o->shm.ref, o->shm.addr, buf, n, err, err_len);
            free(buf);
            if (rc) return rc;
        }
    }
    return 0;
}
