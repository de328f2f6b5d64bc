/* k3 quantize IN OUT --to FORMAT: a BF16 checkpoint into a published format (see
 * src/load/quantize.c for what is selected and what is written). */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#define MAX_PATTERNS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 quantize IN OUT --to FORMAT [options]\n"
            "  -T, --to F          nvfp4 | nvfp4-ct | mxfp4 | fp8-block       (required)\n"
            "      --only RE       quantize linear modules whose name matches RE (repeatable;\n"
            "                      default: routed experts, or every linear for fp8-block)\n"
            "      --exclude RE    never quantize modules matching RE (repeatable)\n"
            "  -t, --threads N     threads, 0 = all CPUs                     (default 0)\n");
}

int cli_quantize(int argc, char **argv) {
    const char *only[MAX_PATTERNS], *excl[MAX_PATTERNS];
    k3_quantize_opts o = {.only = only, .exclude = excl, .progress = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (cli_is_opt(a, "-h", "--help")) {
            usage(stdout);
            return 0;
        } else if (cli_is_opt(a, "-T", "--to")) {
            if (!(o.to = cli_value("quantize", argc, argv, &i))) return 1;
        } else if (cli_is_opt(a, NULL, "--only")) {
            if (o.n_only == MAX_PATTERNS) return cli_fail("quantize", "--only: at most %d patterns", MAX_PATTERNS);
            if (!(only[o.n_only++] = cli_value("quantize", argc, argv, &i))) return 1;
        } else if (cli_is_opt(a, NULL, "--exclude")) {
            if (o.n_exclude == MAX_PATTERNS)
                return cli_fail("quantize", "--exclude: at most %d patterns", MAX_PATTERNS);
            if (!(excl[o.n_exclude++] = cli_value("quantize", argc, argv, &i))) return 1;
        } else if (cli_is_opt(a, "-t", "--threads")) {
            const char *t = cli_value("quantize", argc, argv, &i);
            if (!t || cli_parse_int("quantize", a, t, 0, 256, &v)) return 1;
            o.n_threads = (int)v;
        } else if (a[0] == '-') {
            return cli_fail_unknown("quantize", a);
        } else if (!o.in) {
            o.in = a;
        } else if (!o.out) {
            o.out = a;
        } else {
            return cli_fail("quantize", "unexpected argument: %s", a);
        }
    }
    if (!o.in || !o.out || !o.to) {
        usage(stderr);
        return cli_fail("quantize", "%s: missing", !o.in ? "IN" : !o.out ? "OUT" : "--to");
    }
    k3_error err = {0};
    if (k3_quantize_checkpoint(&o, &err)) return cli_fail_err("quantize", &err);
    fprintf(stderr, "k3 quantize: wrote %s (%s)\n", o.out, o.to);
    return 0;
}
