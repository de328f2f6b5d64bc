/* The streaming reader of k3_model_open: reads the wanted checkpoint tensors into buffers the
 * model keeps, shard by shard in file order, with a pool of pread threads and
 * posix_fadvise(DONTNEED) behind them, so neither the page cache nor the process grows with
 * the bytes a rank skips. No mmap of whole shards: a 1.5 TB checkpoint mapped at once
 * OOM-killed hosts (checkpoint-formats.md §1.5). Large tensors are split into chunks so the
 * threads share them; every byte has one fixed destination, so any thread count gives
 * identical buffers. */
#ifndef K3_LOAD_READ_H
#define K3_LOAD_READ_H

#include "load/model.h"

typedef struct k3_read_opts {
    int n_threads;  /* 0: online CPUs */
    bool progress;  /* \r line on stderr (bytes, GB/s, ETA) once the read passes one second */
} k3_read_opts;

#define K3_READ_CHUNK (16u << 20)

/* The progress line (bytes, GB/s, ETA) for done of total bytes after elapsed seconds:
 * returns false while nothing is due (the first second, less than 0.25 s since the last
 * line, or a final line when none was shown), else fills buf with a \r line (final: ending
 * in a newline). Separate from the reader so its rule is testable without a slow disk. */
bool k3_read_progress_line(char *buf, size_t size, uint64_t done, uint64_t total,
                           double elapsed, double since_last, bool final, bool printed);

/* wanted[k] for checkpoint tensor k. Fills m->views, m->bufs, m->vt, bytes_read/kept. */
int k3_read_tensors(k3_model *m, const bool *wanted, const k3_read_opts *o, k3_error *err);
/* The same views without the bytes (data NULL), for a headers-only open: the decoder then
 * checks every dtype, shape and sibling, and no value. */
int k3_read_headers(k3_model *m, const bool *wanted, k3_error *err);

#endif
