/* Status strings, the k3_error writer, logging and the build identity. */
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifndef K3_COMMIT
#define K3_COMMIT "unknown"
#endif

static const char *const status_names[K3_STATUS_COUNT] = {
    [K3_OK] = "ok",
    [K3_ERR_ARG] = "invalid argument",
    [K3_ERR_IO] = "I/O error",
    [K3_ERR_FORMAT] = "malformed file",
    [K3_ERR_DTYPE] = "wrong dtype",
    [K3_ERR_SHAPE] = "wrong shape",
    [K3_ERR_MISSING] = "missing",
    [K3_ERR_DUPLICATE] = "duplicate",
    [K3_ERR_NUMERIC] = "invalid numeric value",
    [K3_ERR_UNSUPPORTED] = "unsupported",
    [K3_ERR_LIMIT] = "limit exceeded",
    [K3_ERR_NOMEM] = "out of memory",
    [K3_ERR_DEVICE] = "device error",
    [K3_ERR_INTERNAL] = "internal error",
};

const char *k3_status_str(int status) {
    if (status < 0 || status >= K3_STATUS_COUNT)
        return "unknown status";
    return status_names[status];
}

int k3_fail(k3_error *err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

static int log_level = K3_LOG_INFO;
void k3_log_set_level(int level) {
    log_level = level;
}
int k3_log_level(void) {
    return log_level;
}

void k3_log(int level, const char *fmt, ...) {
    if (level > log_level)
        return;
    static const char *const tag[] = {"error: ", "warning: ", "", ""};
    fprintf(stderr, "k3: %s", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double k3_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *k3_version(void) {
    return "0.1.0";
}
const char *k3_build_commit(void) {
    return K3_COMMIT;
}
int k3_have_cuda(void) {
#ifdef K3_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}
