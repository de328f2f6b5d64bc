/* Streaming tensor reads; see read.h. */
#include "load/read.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct job {
    size_t view;       /* destination view */
    size_t shard;
    uint64_t begin;    /* tensor's data offset in the shard (for ordering) */
    uint64_t off, len; /* range within the tensor */
} job;

typedef struct pool {
    k3_model *m;
    const job *jobs;
    size_t n_jobs, next;
    const k3_st_tensor **raw; /* per view */
    k3_st_file **files;       /* per view */
    pthread_mutex_t mu;
    int rc;
    k3_error err;
    uint64_t done, total;
    double t0, last;
    bool progress, printed;
} pool;

static int job_cmp(const void *a, const void *b) {
    const job *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

bool k3_read_progress_line(char *buf, size_t size, uint64_t done, uint64_t total,
                           double elapsed, double since_last, bool final, bool printed) {
    /* a load under a second stays silent; a final line only closes a line already shown */
    if (elapsed < 1.0 || (!final && printed && since_last < 0.25) || (final && !printed))
        return false;
    double gbs = (double)done / elapsed / 1e9;
    double eta = gbs > 0 ? (double)(total - done) / 1e9 / gbs : 0;
    snprintf(buf, size, "\rk3: loading %.2f / %.2f GB, %.2f GB/s, ETA %.0f s   %s",
             (double)done / 1e9, (double)total / 1e9, gbs, eta, final ? "\n" : "");
    return true;
}

static void progress(pool *P, bool final) {
    if (!P->progress) return;
    double now = k3_now();
    char line[160];
    if (!k3_read_progress_line(line, sizeof line, P->done, P->total, now - P->t0, now - P->last,
                               final, P->printed))
        return;
    P->last = now, P->printed = true;
    fputs(line, stderr);
}

static void *worker(void *arg) {
    pool *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->mu);
        size_t k = P->next++;
        bool stop = P->rc != K3_OK || k >= P->n_jobs;
        pthread_mutex_unlock(&P->mu);
        if (stop) return NULL;
        const job *j = &P->jobs[k];
        k3_error e = {0};
        char *dst = (char *)P->m->bufs[j->view] + j->off;
        int rc = k3_st_read_range(P->files[j->view], P->raw[j->view], j->off, dst, j->len,
                                  K3_ST_READ_DONTNEED, &e);
        pthread_mutex_lock(&P->mu);
        /* the shard reader names the file; the message also names the tensor */
        if (rc && P->rc == K3_OK) {
            P->rc = rc;
            k3_fail(&P->err, rc, "%s: %s", P->m->views[j->view].name, e.msg);
        }
        P->done += j->len;
        progress(P, false);
        pthread_mutex_unlock(&P->mu);
    }
}

/* Registers checkpoint tensor ti as the next view, over data (NULL: headers only). */
static int put_view(k3_model *m, const k3_tensor_info *ti, const void *data, k3_error *err) {
    int rc = k3_tview_init(&m->views[m->n_views], ti, data, err);
    if (rc) return rc;
    rc = k3_name_table_put(&m->vt, ti->name, m->n_views++, NULL);
    if (rc != K3_OK)
        return k3_fail(err, rc, "%s: %s in the loaded set", ti->name,
                       rc == K3_ERR_DUPLICATE ? "present twice" : "out of memory");
    return K3_OK;
}

int k3_read_tensors(k3_model *m, const bool *wanted, const k3_read_opts *o, k3_error *err) {
    size_t nt = k3_checkpoint_tensor_count(m->ck), nv = 0, nj = 0;
    for (size_t k = 0; k < nt; k++) nv += wanted[k];
    m->views = calloc(nv ? nv : 1, sizeof *m->views);
    m->bufs = calloc(nv ? nv : 1, sizeof *m->bufs);
    pool P = {.m = m, .t0 = k3_now(), .progress = o->progress};
    P.raw = calloc(nv ? nv : 1, sizeof *P.raw);
    P.files = calloc(nv ? nv : 1, sizeof *P.files);
    job *jobs = NULL;
    int rc = K3_OK;
    if (!m->views || !m->bufs || !P.raw || !P.files) {
        rc = k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
        goto done;
    }
    size_t cap_jobs = 0;
    for (size_t k = 0; k < nt && !rc; k++) {
        if (!wanted[k]) continue;
        k3_tensor_info ti;
        k3_st_file *f;
        const k3_st_tensor *t;
        if ((rc = k3_checkpoint_tensor_info(m->ck, k, &ti, err))) break;
        if ((rc = k3_checkpoint_tensor_raw(m->ck, k, &f, &t, err))) break;
        size_t v = m->n_views;
        /* 64-byte alignment suits every element type and SIMD loads */
        size_t alloc = (size_t)((ti.nbytes + 63) / 64 * 64);
        if (ti.nbytes > SIZE_MAX - 64 || !(m->bufs[v] = aligned_alloc(64, alloc ? alloc : 64))) {
            rc = k3_fail(err, K3_ERR_NOMEM, "%s: cannot allocate %llu bytes", ti.name,
                         (unsigned long long)ti.nbytes);
            break;
        }
        P.raw[v] = t, P.files[v] = f;
        if ((rc = put_view(m, &ti, m->bufs[v], err))) break;
        for (uint64_t off = 0; off < ti.nbytes; off += K3_READ_CHUNK) {
            if (nj == cap_jobs) {
                cap_jobs = cap_jobs ? cap_jobs * 2 : 1024;
                job *nj2 = realloc(jobs, cap_jobs * sizeof *jobs);
                if (!nj2) {
                    rc = k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
                    break;
                }
                jobs = nj2;
            }
            uint64_t len = ti.nbytes - off < K3_READ_CHUNK ? ti.nbytes - off : K3_READ_CHUNK;
            jobs[nj++] = (job){.view = v, .shard = ti.shard, .begin = t->begin, .off = off, .len = len};
            P.total += len;
        }
        m->bytes_kept += ti.nbytes;
    }
    if (rc) goto done;
    qsort(jobs, nj, sizeof *jobs, job_cmp);
    P.jobs = jobs, P.n_jobs = nj;
    pthread_mutex_init(&P.mu, NULL);
    int nthr = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthr < 1) nthr = 1;
    if ((size_t)nthr > nj) nthr = nj ? (int)nj : 1;
    pthread_t th[256];
    int started = 0;
    for (; started < nthr && started < 256; started++)
        if (pthread_create(&th[started], NULL, worker, &P)) break;
    if (started == 0) worker(&P);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&P.mu);
    progress(&P, true);
    m->bytes_read = P.done;
    if (P.rc) {
        rc = P.rc;
        if (err) *err = P.err;
    }
done:
    free(jobs);
    free(P.raw);
    free(P.files);
    return rc;
}

int k3_read_headers(k3_model *m, const bool *wanted, k3_error *err) {
    size_t nt = k3_checkpoint_tensor_count(m->ck), nv = 0;
    for (size_t k = 0; k < nt; k++) nv += wanted[k];
    if (!(m->views = calloc(nv ? nv : 1, sizeof *m->views)))
        return k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
    for (size_t k = 0; k < nt; k++) {
        if (!wanted[k]) continue;
        k3_tensor_info ti;
        int rc = k3_checkpoint_tensor_info(m->ck, k, &ti, err);
        if (rc) return rc;
        if ((rc = put_view(m, &ti, NULL, err))) return rc;
    }
    return K3_OK;
}
