/* k3 — the public API of the Kimi K3 inference engine.
 *
 * One narrow header: opaque handles, options structs filled with designated initializers,
 * int status codes (K3_OK == 0) with k3_status_str, and a caller-owned k3_error that receives
 * a message naming the file, tensor and field at fault. Every close/free accepts NULL.
 * The CLI and any front-end include only this header. */
#ifndef K3_H
#define K3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------------------ */

enum {
    K3_OK = 0,
    K3_ERR_ARG,         /* a bad argument or option from the caller */
    K3_ERR_IO,          /* open/read/write/mmap failed (message carries strerror) */
    K3_ERR_FORMAT,      /* a malformed file: header, JSON, offsets, shapes */
    K3_ERR_DTYPE,       /* a tensor of the wrong dtype */
    K3_ERR_SHAPE,       /* a tensor of the wrong shape */
    K3_ERR_MISSING,     /* a required tensor, field or scale is absent */
    K3_ERR_DUPLICATE,   /* a name present twice */
    K3_ERR_NUMERIC,     /* NaN, Inf, zero or negative where a finite positive value is needed */
    K3_ERR_UNSUPPORTED, /* well-formed, but k3 does not implement it */
    K3_ERR_LIMIT,       /* beyond a stated limit (size cap, top-k, tokens per launch) */
    K3_ERR_NOMEM,
    K3_ERR_DEVICE,      /* no GPU, or a CUDA/NCCL failure */
    K3_ERR_INTERNAL,
    K3_STATUS_COUNT
};

const char *k3_status_str(int status);

/* Caller-owned error: the callee writes the status and one line naming what is wrong. */
typedef struct k3_error {
    int status;
    char msg[1024];
} k3_error;

/* The build: version string, commit and which backends were compiled in. */
const char *k3_version(void);
const char *k3_build_commit(void);
int k3_have_cuda(void); /* 1 when built with CUDA (a device may still be absent) */

#ifdef __cplusplus
}
#endif
#endif
