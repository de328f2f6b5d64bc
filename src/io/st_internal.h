/* Private to the safetensors reader: the file handle and the header validator shared by
 * safetensors.c (open, views, reads) and st_header.c (parsing and validation). */
#ifndef K3_ST_INTERNAL_H
#define K3_ST_INTERNAL_H

#include "io/name_table.h"
#include "io/safetensors.h"

#include <pthread.h>

struct k3_st_file {
    char *path;
    int fd;              /* -1 when the file lives in memory */
    const uint8_t *mem;  /* the borrowed bytes of k3_st_parse, else NULL */
    uint64_t size;       /* whole file */
    uint64_t data_start; /* 8 + N */
    size_t n;
    k3_st_tensor *t; /* [n], data-offset order */
    char *names;     /* every name, NUL-terminated, back to back */
    k3_name_table by_name;
    size_t n_meta;
    char **meta; /* [2 * n_meta]: key, value, sorted by key */
    pthread_mutex_t map_lock;
    void *map; /* whole-file mapping, made on the first view */
};

/* Validates header bytes hdr[0..len) of f (f->path, size and data_start already set) and
 * fills the tensor table, the name table and the metadata. */
int k3_st_parse_header(k3_st_file *f, const char *hdr, size_t len, k3_error *err);

#endif
