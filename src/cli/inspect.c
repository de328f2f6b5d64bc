/* k3 inspect PATH [--json]: what a checkpoint holds, read through the public API only.
 *
 * PATH is a .safetensors file or a checkpoint directory (with or without
 * model.safetensors.index.json); opening it validates every shard. The report lists each
 * tensor (name, dtype, shape, bytes, shard), totals (count, bytes, per dtype, per
 * quantization) and the quantization each weight appears to carry, judged from its dtype and
 * its sibling tensors (checkpoint-formats.md §3-§6, §8.2 item 6): NVFP4 (ModelOpt and
 * compressed-tensors), MXFP4, MXFP8, FP8 128x128 blocks, or plain. Scale tensors are reported
 * as part of their weight. The judgement and its checks are the loader's
 * (k3_checkpoint_weight_format), so inspect accepts no set a load would refuse, except a lone
 * weight (reported by its dtype) and MXFP8, which k3 does not load: a problem is shown in the
 * report, names the tensor at fault, and makes the exit status 1.
 *
 * The pieces are separate functions (classify, text report, JSON report). For a model
 * directory (with config.json) a per-layer summary follows, read through k3_model_open with
 * headers_only (configs, tensor plan and declarations checked, no weight read): attention
 * kind, FFN kind, routed-expert format and count, bytes; --ep-size N adds which experts and
 * bytes each expert-parallel rank would own (the partition of moe.md §2.6). --summary leaves
 * the per-tensor list out (K3 has ~500,000 tensors) and keeps totals and the layer table. A
 * config.json that is malformed, or that the tensors disagree with, fails the command like any
 * other malformed input; one for a model k3 does not run (K3_ERR_UNSUPPORTED: another
 * model_type, a feature k3 lacks) only skips the summary, with a note on stderr. */
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum quant {
    Q_PLAIN = 0,
    Q_NVFP4,     /* ModelOpt: weight U8 [N,K/2], weight_scale E4M3 [N,K/16], weight_scale_2 [] */
    Q_NVFP4_CT,  /* compressed-tensors: weight_packed, weight_scale E4M3, weight_global_scale */
    Q_MXFP4,     /* weight_packed U8 [N,K/2], weight_scale U8|E8M0 [N,K/32] */
    Q_MXFP8,     /* weight E4M3 [N,K], weight_scale U8|E8M0 [N,K/32] */
    Q_FP8_BLOCK, /* weight E4M3 [N,K], F32 scale [ceil(N/128),(1,)ceil(K/128)(,1)] */
    Q_SCALE,     /* a scale tensor, reported with its weight */
    Q_COUNT
} quant;

/* the names k3_checkpoint_weight_format gives, in enum order */
static const char *const quant_names[Q_COUNT] = {"plain", "NVFP4",     "NVFP4-CT", "MXFP4",
                                                 "MXFP8", "FP8-block", "scale"};

typedef struct item {
    k3_tensor_info info;
    quant q;
    int64_t owner;    /* for Q_SCALE: index of the weight it belongs to */
    const char *role; /* for Q_SCALE: "weight_scale", ... */
    char *problem;    /* owned; NULL when none (K3 has ~500k tensors: no fixed buffer each) */
} item;

static const char *const scale_roles[] = {"weight_scale",     "weight_scale_2",
                                          "weight_scale_inv", "weight_global_scale",
                                          "input_scale",      "input_global_scale"};
enum { N_ROLES = sizeof scale_roles / sizeof scale_roles[0] };

static bool ends_with(const char *s, const char *suffix, size_t *prefix_len) {
    size_t l = strlen(s), m = strlen(suffix);
    if (l <= m || strcmp(s + l - m, suffix))
        return false;
    *prefix_len = l - m;
    return true;
}

static quant quant_of(const char *name) {
    for (int q = 0; q < Q_SCALE; q++)
        if (!strcmp(quant_names[q], name))
            return (quant)q;
    return Q_PLAIN;
}

/* Each weight's format and problem come from the library (the loader's dtype, shape and
 * sibling rules); what is left here is which tensors are listed as its scales. */
static int classify(const k3_checkpoint *ck, item *it, size_t n) {
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t plen;
        if (!ends_with(it[i].info.name, ".weight_packed", &plen) &&
            !ends_with(it[i].info.name, ".weight", &plen))
            continue;
        if (cap < plen + 32) {
            cap = plen + 32;
            char *p = realloc(buf, cap);
            if (!p) {
                rc = cli_fail("inspect", "out of memory");
                break;
            }
            buf = p;
        }
        snprintf(buf, cap, "%.*s", (int)plen, it[i].info.name);
        const char *fmt;
        k3_error err = {0};
        if (k3_checkpoint_weight_format(ck, buf, &fmt, &err) &&
            !(it[i].problem = strdup(err.msg))) {
            rc = cli_fail("inspect", "out of memory");
            break;
        }
        it[i].q = quant_of(fmt);
        if (it[i].q == Q_PLAIN)
            continue;
        for (int r = 0; r < N_ROLES; r++) {
            snprintf(buf, cap, "%.*s.%s", (int)plen, it[i].info.name, scale_roles[r]);
            int64_t j = k3_checkpoint_find(ck, buf);
            if (j >= 0 && it[j].q == Q_PLAIN) {
                it[j].q = Q_SCALE;
                it[j].owner = (int64_t)i;
                it[j].role = scale_roles[r];
            }
        }
    }
    free(buf);
    return rc;
}

static void shape_str(const k3_tensor_info *t, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->rank && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (o < cap)
        snprintf(out + o, cap - o, "]");
}

typedef struct totals {
    uint64_t bytes;
    uint64_t dtype_n[K3_DTYPE_COUNT], dtype_bytes[K3_DTYPE_COUNT];
    uint64_t quant_n[Q_COUNT], quant_bytes[Q_COUNT]; /* weights, and bytes including scales */
    size_t problems;
} totals;

static void count(const item *it, size_t n, totals *t) {
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const k3_tensor_info *x = &it[i].info;
        t->bytes += x->nbytes;
        t->dtype_n[x->dtype]++;
        t->dtype_bytes[x->dtype] += x->nbytes;
        quant q = it[i].q == Q_SCALE ? it[it[i].owner].q : it[i].q;
        if (it[i].q != Q_SCALE)
            t->quant_n[q]++;
        t->quant_bytes[q] += x->nbytes;
        if (it[i].problem)
            t->problems++;
    }
}

/* list: the per-tensor table (--summary leaves it out; a K3 checkpoint has ~500k rows). A
 * tensor with a problem is listed even then, so the exit status 1 has its reason on screen. */
static void report_text(const k3_checkpoint *ck, const item *it, size_t n, const totals *t,
                        bool list) {
    int wname = 4, wshard = 5;
    for (size_t i = 0; i < n; i++) {
        if (!list && !it[i].problem) continue;
        int l = (int)strlen(it[i].info.name), s = (int)strlen(it[i].info.shard_name);
        if (l > wname)
            wname = l;
        if (s > wshard)
            wshard = s;
    }
    if (list || t->problems)
        printf("%-*s  %-11s  %-22s  %14s  %-*s  %s\n", wname, "NAME", "DTYPE", "SHAPE", "BYTES",
               wshard, "SHARD", "QUANT");
    for (size_t i = 0; i < n; i++) {
        if (!list && !it[i].problem) continue;
        char shp[200], q[1400];
        shape_str(&it[i].info, shp, sizeof shp);
        if (it[i].q == Q_SCALE)
            snprintf(q, sizeof q, "%s of %s", it[i].role, it[it[i].owner].info.name);
        else
            snprintf(q, sizeof q, "%s%s%s", quant_names[it[i].q],
                     it[i].problem ? "  PROBLEM: " : "", it[i].problem ? it[i].problem : "");
        printf("%-*s  %-11s  %-22s  %14" PRIu64 "  %-*s  %s\n", wname, it[i].info.name,
               k3_dtype_name(it[i].info.dtype), shp, it[i].info.nbytes, wshard,
               it[i].info.shard_name, q);
    }
    printf("\n%zu tensors, %" PRIu64 " bytes (%.3f GiB) in %zu shard(s)%s\n", n, t->bytes,
           (double)t->bytes / (1024.0 * 1024 * 1024), k3_checkpoint_shard_count(ck),
           k3_checkpoint_has_index(ck) ? " with an index" : "");
    printf("by dtype:\n");
    for (int d = 1; d < K3_DTYPE_COUNT; d++)
        if (t->dtype_n[d])
            printf("  %-11s %10" PRIu64 " tensors %16" PRIu64 " bytes\n",
                   k3_dtype_name((k3_dtype)d), t->dtype_n[d], t->dtype_bytes[d]);
    printf("by quantization (weights; bytes include their scales):\n");
    for (int q = 0; q < Q_SCALE; q++)
        if (t->quant_n[q])
            printf("  %-12s %10" PRIu64 " weights %16" PRIu64 " bytes\n", quant_names[q],
                   t->quant_n[q], t->quant_bytes[q]);
}

static cJSON *json_u64(uint64_t v) {
    char d[24];
    snprintf(d, sizeof d, "%" PRIu64, v); /* exact: cJSON numbers are doubles */
    return cJSON_CreateRaw(d);
}

static cJSON *report_json(const char *path, const k3_checkpoint *ck, const item *it, size_t n,
                          const totals *t, bool list) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "path", path);
    cJSON_AddStringToObject(root, "dir", k3_checkpoint_path(ck));
    cJSON_AddBoolToObject(root, "index", k3_checkpoint_has_index(ck));
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    for (size_t s = 0; s < k3_checkpoint_shard_count(ck); s++) {
        cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", k3_checkpoint_shard_name(ck, s));
        for (size_t i = 0; i < k3_checkpoint_metadata_count(ck, s); i++) {
            const char *k, *v;
            if (!k3_checkpoint_metadata_at(ck, s, i, &k, &v, NULL))
                cJSON_AddStringToObject(m, k, v);
        }
        cJSON_AddItemToObject(o, "metadata", m);
        cJSON_AddItemToArray(shards, o);
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "tensors");
    for (size_t i = 0; i < n; i++) {
        if (!list && !it[i].problem) continue;
        const k3_tensor_info *x = &it[i].info;
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "name", x->name);
        cJSON_AddStringToObject(o, "dtype", k3_dtype_name(x->dtype));
        for (int d = 0; d < x->rank; d++)
            cJSON_AddItemToArray(sh, json_u64(x->shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        cJSON_AddItemToObject(o, "bytes", json_u64(x->nbytes));
        cJSON_AddStringToObject(o, "shard", x->shard_name);
        if (it[i].q == Q_SCALE) {
            cJSON_AddStringToObject(o, "quant", quant_names[it[it[i].owner].q]);
            cJSON_AddStringToObject(o, "part_of", it[it[i].owner].info.name);
            cJSON_AddStringToObject(o, "role", it[i].role);
        } else {
            cJSON_AddStringToObject(o, "quant", quant_names[it[i].q]);
        }
        if (it[i].problem)
            cJSON_AddStringToObject(o, "problem", it[i].problem);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON *tot = cJSON_AddObjectToObject(root, "totals");
    cJSON_AddItemToObject(tot, "tensors", json_u64(n));
    cJSON_AddItemToObject(tot, "bytes", json_u64(t->bytes));
    cJSON_AddItemToObject(tot, "problems", json_u64(t->problems));
    cJSON *bd = cJSON_AddObjectToObject(tot, "by_dtype"),
          *bq = cJSON_AddObjectToObject(tot, "by_quant");
    for (int d = 1; d < K3_DTYPE_COUNT; d++)
        if (t->dtype_n[d]) {
            cJSON *o = cJSON_AddObjectToObject(bd, k3_dtype_name((k3_dtype)d));
            cJSON_AddItemToObject(o, "tensors", json_u64(t->dtype_n[d]));
            cJSON_AddItemToObject(o, "bytes", json_u64(t->dtype_bytes[d]));
        }
    for (int q = 0; q < Q_SCALE; q++)
        if (t->quant_n[q]) {
            cJSON *o = cJSON_AddObjectToObject(bq, quant_names[q]);
            cJSON_AddItemToObject(o, "weights", json_u64(t->quant_n[q]));
            cJSON_AddItemToObject(o, "bytes", json_u64(t->quant_bytes[q]));
        }
    return root;
}

static void usage(FILE *f) {
    fprintf(f, "usage: k3 inspect PATH [--json] [--summary] [--ep-size N]\n"
               "  PATH          a .safetensors file or a checkpoint directory\n"
               "  --json        machine-readable JSON on stdout (default: a table)\n"
               "  -s, --summary totals and the per-layer summary only, no per-tensor list\n"
               "                (tensors with a problem are still listed)\n"
               "  --ep-size N   preview the experts and bytes of each of N expert-parallel ranks\n"
               "  -h, --help    this help\n");
}

/* Opens a model directory for its per-layer summary: *out stays NULL where there is nothing
 * to summarize (no config.json; a model k3 does not run, with a note). With --ep-size the
 * split is checked here, before the report prints a line, so a bad size fails with nothing
 * on stdout rather than after the whole tensor list. Returns 0, or 1 after printing an
 * error. */
static int summary_open(const char *path, long ep_size, k3_model **out) {
    char cfg[4096];
    struct stat st;
    *out = NULL;
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (stat(cfg, &st)) {
        if (ep_size > 0) return cli_fail("inspect", "--ep-size: %s has no config.json", path);
        return 0; /* a bare safetensors file or directory: nothing to summarize */
    }
    k3_model *m = NULL;
    k3_error err = {0};
    k3_model_opts o = {.path = path, .headers_only = 1};
    if (k3_model_open(&m, &o, &err)) {
        /* a config of a model k3 does not run is no fault of the checkpoint; a malformed
         * config.json, or tensors that disagree with it, are (exit status 1) */
        if (ep_size > 0 || err.status != K3_ERR_UNSUPPORTED) return cli_fail_err("inspect", &err);
        fprintf(stderr, "k3 inspect: no per-layer summary: %s: %s\n", k3_status_str(err.status), err.msg);
        return 0;
    }
    k3_rank_info ri;
    if (ep_size > 0 && k3_model_rank_info(m, (int)ep_size, 0, &ri, &err)) {
        k3_model_close(m);
        return cli_fail("inspect", "--ep-size %ld: %s", ep_size, err.msg);
    }
    *out = m;
    return 0;
}

/* The per-layer summary and the expert-parallel preview of a model opened by summary_open.
 * Returns 0, or 1 after printing an error. json: added to root; else printed as tables. */
static int model_summary(k3_model *m, long ep_size, cJSON *root) {
    k3_error err = {0};
    k3_model_info mi;
    k3_model_get_info(m, &mi);
    cJSON *layers = root ? cJSON_AddArrayToObject(root, "layers") : NULL;
    if (!root) printf("\nlayers (%d, tensor prefix \"%s\"):\n  %5s  %-4s  %-5s  %7s  %-10s  %16s  %16s\n",
                      mi.n_layers, mi.prefix, "LAYER", "ATTN", "FFN", "EXPERTS", "FORMAT", "BYTES",
                      "EXPERT BYTES");
    int rc = 0;
    for (int l = 0; l < mi.n_layers && !rc; l++) {
        k3_layer_info li;
        if (k3_model_layer_info(m, l, &li, &err)) {
            rc = cli_fail_err("inspect", &err);
            break;
        }
        if (root) {
            cJSON *o2 = cJSON_CreateObject();
            cJSON_AddNumberToObject(o2, "layer", l);
            cJSON_AddStringToObject(o2, "attention", li.attn);
            cJSON_AddStringToObject(o2, "ffn", li.ffn);
            cJSON_AddNumberToObject(o2, "experts", li.n_experts);
            if (li.expert_format) cJSON_AddStringToObject(o2, "expert_format", li.expert_format);
            cJSON_AddItemToObject(o2, "bytes", json_u64(li.bytes));
            cJSON_AddItemToObject(o2, "expert_bytes", json_u64(li.expert_bytes));
            cJSON_AddItemToArray(layers, o2);
        } else {
            printf("  %5d  %-4s  %-5s  %7d  %-10s  %16" PRIu64 "  %16" PRIu64 "\n", l, li.attn, li.ffn,
                   li.n_experts, li.expert_format ? li.expert_format : "-", li.bytes, li.expert_bytes);
        }
    }
    if (!rc && ep_size > 0) {
        cJSON *ranks = NULL;
        if (root) {
            cJSON *ep = cJSON_AddObjectToObject(root, "expert_parallel");
            cJSON_AddNumberToObject(ep, "size", (double)ep_size);
            ranks = cJSON_AddArrayToObject(ep, "ranks");
        } else {
            printf("\nexpert parallel over %ld ranks (%d experts per MoE layer):\n  %5s  %-13s  %16s  %16s\n",
                   ep_size, mi.n_experts, "RANK", "EXPERTS", "EXPERT BYTES", "TOTAL BYTES");
        }
        for (int r = 0; r < ep_size && !rc; r++) {
            k3_rank_info ri;
            if (k3_model_rank_info(m, (int)ep_size, r, &ri, &err)) {
                rc = cli_fail_err("inspect", &err);
                break;
            }
            if (root) {
                cJSON *o2 = cJSON_CreateObject();
                cJSON_AddNumberToObject(o2, "rank", r);
                cJSON_AddNumberToObject(o2, "first_expert", ri.first);
                cJSON_AddNumberToObject(o2, "experts", ri.count);
                cJSON_AddItemToObject(o2, "expert_bytes", json_u64(ri.expert_bytes));
                cJSON_AddItemToObject(o2, "total_bytes", json_u64(ri.total_bytes));
                cJSON_AddItemToArray(ranks, o2);
            } else {
                char range[32];
                snprintf(range, sizeof range, "%d..%d", ri.first, ri.first + ri.count - 1);
                printf("  %5d  %-13s  %16" PRIu64 "  %16" PRIu64 "\n", r, range, ri.expert_bytes,
                       ri.total_bytes);
            }
        }
    }
    return rc;
}

int cli_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool json = false, summary = false;
    long ep_size = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--summary") || !strcmp(argv[i], "-s")) summary = true;
        else if (!strcmp(argv[i], "--ep-size")) {
            const char *v = cli_value("inspect", argc, argv, &i);
            if (!v || cli_parse_int("inspect", "--ep-size", v, 1, 65536, &ep_size)) return 1;
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1])
            return cli_fail_unknown("inspect", argv[i]);
        else if (path)
            return cli_fail("inspect", "more than one PATH ('%s' and '%s')", path, argv[i]);
        else
            path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 1;
    }
    k3_error err = {0};
    k3_checkpoint *ck = NULL;
    if (k3_checkpoint_open(&ck, path, &err))
        return cli_fail_err("inspect", &err);
    size_t n = k3_checkpoint_tensor_count(ck);
    item *it = calloc(n ? n : 1, sizeof *it);
    if (!it) {
        k3_checkpoint_close(ck);
        return cli_fail("inspect", "out of memory for %zu tensors", n);
    }
    int rc = 0;
    k3_model *m = NULL;
    for (size_t i = 0; i < n && !rc; i++)
        if (k3_checkpoint_tensor_info(ck, i, &it[i].info, &err))
            rc = cli_fail_err("inspect", &err);
    if (!rc)
        rc = classify(ck, it, n);
    /* without --ep-size the tensor report comes first, so that a checkpoint whose config the
     * tensors contradict still shows them (and its problems) before the error */
    if (!rc && ep_size > 0) rc = summary_open(path, ep_size, &m);
    if (!rc) {
        totals t;
        count(it, n, &t);
        if (json) {
            cJSON *root = report_json(path, ck, it, n, &t, !summary);
            if (root && !m) rc = summary_open(path, ep_size, &m);
            if (root && !rc && m) rc = model_summary(m, ep_size, root);
            char *s = root && !rc ? cJSON_Print(root) : NULL;
            if (s) printf("%s\n", s);
            else if (!rc) rc = cli_fail("inspect", "out of memory building the JSON report");
            cJSON_free(s);
            cJSON_Delete(root);
        } else {
            report_text(ck, it, n, &t, !summary);
            if (!m) rc = summary_open(path, ep_size, &m);
            if (!rc && m) rc = model_summary(m, ep_size, NULL);
        }
        if (!rc && t.problems) {
            for (size_t i = 0; i < n; i++)
                if (it[i].problem) { /* the message names the tensor at fault */
                    cli_fail("inspect", "%s", it[i].problem);
                    break;
                }
            rc = cli_fail("inspect", "%zu tensor(s) with inconsistent quantization", t.problems);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(it[i].problem);
    free(it);
    k3_model_close(m);
    k3_checkpoint_close(ck);
    return rc;
}
