/* Internal helpers every module uses: error reporting into a caller k3_error, checked
 * integer arithmetic for sizes read from files, and stderr logging. No allocation policy
 * lives here; modules own their memory. */
#ifndef K3_BASE_H
#define K3_BASE_H

#include "k3.h"
#include <stdbool.h>
#include <stdint.h>

#if defined(__GNUC__)
#define K3_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define K3_PRINTF(a, b)
#endif

/* Formats the message into err (if non-NULL) and returns status, so callers write
 * `return k3_fail(err, K3_ERR_FORMAT, "%s: ...", path);`. */
int k3_fail(k3_error *err, int status, const char *fmt, ...) K3_PRINTF(3, 4);

/* Checked arithmetic: return false on overflow and leave *out untouched. */
static inline bool k3_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}
static inline bool k3_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

/* Logging goes to stderr; stdout is reserved for model text and requested output. */
enum { K3_LOG_ERROR = 0, K3_LOG_WARN, K3_LOG_INFO, K3_LOG_DEBUG };
void k3_log_set_level(int level);
int k3_log_level(void);
void k3_log(int level, const char *fmt, ...) K3_PRINTF(2, 3);
#define k3_warn(...) k3_log(K3_LOG_WARN, __VA_ARGS__)
#define k3_info(...) k3_log(K3_LOG_INFO, __VA_ARGS__)

/* Monotonic seconds, for timing and progress lines. */
double k3_now(void);

#endif
