/* Header-only views of a checkpoint; see ckviews.h. Also the public k3_checkpoint_weight_format,
 * which is inspect's judgement of a weight by the loader's own rules. */
#include "load/ckviews.h"

#include <string.h>

const k3_tview *k3_ck_views_find(void *ctx, const char *name) {
    k3_ck_views *cv = ctx;
    for (size_t i = 0; i < cv->n; i++)
        if (!strcmp(cv->v[i].name, name)) return &cv->v[i];
    int64_t k = k3_checkpoint_find(cv->ck, name);
    if (k < 0 || cv->rc) return NULL;
    k3_tensor_info ti;
    if (cv->n == K3_N_QSUFFIX)
        cv->rc = k3_fail(&cv->err, K3_ERR_INTERNAL,
                         "%s: more tensors looked up than one module has", name);
    else if (!(cv->rc = k3_checkpoint_tensor_info(cv->ck, (size_t)k, &ti, &cv->err)))
        cv->rc = k3_tview_init(&cv->v[cv->n], &ti, NULL, &cv->err);
    return cv->rc ? NULL : &cv->v[cv->n++];
}

int k3_checkpoint_weight_format(const k3_checkpoint *ck, const char *module, const char **format,
                                k3_error *err) {
    if (!format) return k3_fail(err, K3_ERR_ARG, "k3_checkpoint_weight_format: format: NULL");
    if (!ck || !module) {
        *format = "plain"; /* the header promises *format on every failure */
        return k3_fail(err, K3_ERR_ARG, "k3_checkpoint_weight_format: %s: NULL", ck ? "module" : "ck");
    }
    k3_ck_views cv = {.ck = ck};
    int rc = k3_decode_classify(module, k3_ck_views_find, &cv, format, err);
    if (cv.rc) {
        if (err) *err = cv.err;
        return cv.rc;
    }
    return rc;
}
