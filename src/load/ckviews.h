/* Header-only views of a checkpoint's tensors, looked up by name: what the decoder's dtype and
 * shape rules need to judge a module before any byte is read (inspect, and the loader's
 * per-tensor inference where nothing declares a format). One k3_ck_views serves one module at a
 * time; its views live as long as it does. */
#ifndef K3_LOAD_CKVIEWS_H
#define K3_LOAD_CKVIEWS_H

#include "load/decode.h"

typedef struct k3_ck_views {
    const k3_checkpoint *ck;
    k3_tview v[K3_N_QSUFFIX]; /* the tensors found so far (one module has at most these) */
    size_t n;
    int rc;                   /* a view that could not be made: the error is in err */
    k3_error err;
} k3_ck_views;

/* A k3_tview_find_fn over ctx = k3_ck_views (data NULL). A tensor whose view cannot be made
 * (see k3_tview_init) is reported as absent with ctx->rc set: check it after the decoder ran. */
const k3_tview *k3_ck_views_find(void *ctx, const char *name);

#endif
