#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *status_str(int status) {
    switch (status) {
    case STATUS_OK: return "OK";
    case STATUS_INVALID: return "INVALID";
    case STATUS_NOT_FOUND: return "NOT_FOUND";
    case STATUS_UNAVAILABLE: return "UNAVAILABLE";
    case STATUS_UNSUPPORTED: return "UNSUPPORTED";
    case STATUS_INTERNAL: return "INTERNAL";
    case STATUS_NOMEM: return "NOMEM";
    case STATUS_CANCELLED: return "CANCELLED";
    case STATUS_DATA_DEPENDENT: return "DATA_DEPENDENT";
    default: return "UNKNOWN";
    }
}

int status_http_code(int status) {
    switch (status) {
    case STATUS_OK: return 200;
    case STATUS_INVALID: return 400;
    case STATUS_NOT_FOUND: return 404;
    case STATUS_UNAVAILABLE: return 503;
    case STATUS_UNSUPPORTED: return 501;
    case STATUS_DATA_DEPENDENT: return 501;
    case STATUS_CANCELLED: return 499;
    default: return 500;
    }
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
