#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

struct status_row {
    const char *name, *desc, *phrase;
    int http;
    enum grpc_code grpc;
    enum status_reason reason;
};

/* Indexed by -status: STATUS_MAP's values run 0, -1, -2, ... */
static const struct status_row rows[] = {
#define STATUS_ROW_(n, value, h, p, g, r, d)                                                                           \
    [-(value)] = {.name = #n, .desc = d, .phrase = p, .http = h, .grpc = g, .reason = STATUS_REASON_##r},
    STATUS_MAP(STATUS_ROW_)
#undef STATUS_ROW_
};

_Static_assert(sizeof rows / sizeof rows[0] == STATUS_N_, "STATUS_N_ is the number of rows of STATUS_MAP");

static const char *const reason_labels[] = {
#define STATUS_REASON_LABEL_(name, label) label,
    STATUS_REASON_MAP(STATUS_REASON_LABEL_)
#undef STATUS_REASON_LABEL_
};

static const struct status_row *row(int status) {
    return status <= 0 && status > -STATUS_N_ ? &rows[-status] : NULL;
}

const char *status_str(int status) {
    const struct status_row *r = row(status);
    return r ? r->name : "UNKNOWN";
}

const char *status_desc(int status) {
    const struct status_row *r = row(status);
    return r ? r->desc : "an unknown status";
}

int status_http(int status) {
    const struct status_row *r = row(status);
    return r ? r->http : 500;
}

const char *status_http_phrase(int http_code) {
    for (int i = 0; i < STATUS_N_; i++)
        if (rows[i].http == http_code) return rows[i].phrase;
    return "Error";
}

enum grpc_code status_grpc(int status) {
    const struct status_row *r = row(status);
    return r ? r->grpc : GRPC_INTERNAL;
}

enum status_reason status_reason(int status) {
    const struct status_row *r = row(status);
    return r ? r->reason : STATUS_REASON_INTERNAL;
}

const char *status_reason_str(enum status_reason reason) {
    return (unsigned)reason < STATUS_REASON_N_ ? reason_labels[reason] : "internal";
}

int status_set(char *err, size_t err_len, int status, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}
