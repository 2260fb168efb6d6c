/* status.c - status names and the thread-local error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *mha_version(void) { return MHA_VERSION_STRING; }

const char *mha_status_string(mha_status status) {
    switch (status) {
    case MHA_OK: return "ok";
    case MHA_ERR_NULL: return "null pointer";
    case MHA_ERR_SHAPE: return "shape mismatch";
    case MHA_ERR_DTYPE: return "wrong dtype";
    case MHA_ERR_VALUE: return "invalid value";
    case MHA_ERR_OVERFLOW: return "size overflow";
    case MHA_ERR_NOMEM: return "out of memory";
    case MHA_ERR_IO: return "i/o error";
    case MHA_ERR_FORMAT: return "bad file format";
    case MHA_ERR_ALIAS: return "output overlaps input";
    case MHA_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}

const char *mha_last_error(void) { return last_error; }

mha_status mha_error(mha_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *mha_shape_str(const mha_tensor *t, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "(");
    for (int i = 0; t && i < t->ndim && i < MHA_MAX_DIMS && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, ")");
    return buf;
}
