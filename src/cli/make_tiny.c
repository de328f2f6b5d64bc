/* k3 make-tiny DIR: writes the built-in test model (or a small / one-K3-layer benchmark
 * model) as a real checkpoint in a published format. See src/load/tiny.h. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 make-tiny DIR [options]\n"
            "  -f, --format F    nvfp4 | nvfp4-ct | mxfp4 | bf16        (default nvfp4)\n"
            "  -P, --preset P    tiny | small | k3-layer               (default tiny)\n"
            "  -s, --seed N      weight seed                           (default 0)\n"
            "  -t, --threads N   generator threads, 0 = all CPUs       (default 0)\n");
}

int cli_make_tiny(int argc, char **argv) {
    k3_make_tiny_opts o = {.format = "nvfp4", .preset = "tiny", .progress = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (cli_is_opt(a, "-h", "--help")) {
            usage(stdout);
            return 0;
        } else if (cli_is_opt(a, "-f", "--format")) {
            if (!(o.format = cli_value("make-tiny", argc, argv, &i))) return 1;
        } else if (cli_is_opt(a, "-P", "--preset")) {
            if (!(o.preset = cli_value("make-tiny", argc, argv, &i))) return 1;
        } else if (cli_is_opt(a, "-s", "--seed")) {
            if (!(v = cli_value("make-tiny", argc, argv, &i)) ||
                cli_parse_int("make-tiny", a, v, 0, 2147483647L, &n))
                return 1;
            o.seed = (uint64_t)n;
        } else if (cli_is_opt(a, "-t", "--threads")) {
            if (!(v = cli_value("make-tiny", argc, argv, &i)) ||
                cli_parse_int("make-tiny", a, v, 0, 256, &n))
                return 1;
            o.n_threads = (int)n;
        } else if (a[0] == '-') {
            return cli_fail_unknown("make-tiny", a);
        } else if (!o.dir) {
            o.dir = a;
        } else {
            return cli_fail("make-tiny", "unexpected argument: %s", a);
        }
    }
    if (!o.dir) {
        usage(stderr);
        return cli_fail("make-tiny", "DIR: missing");
    }
    k3_error err = {0};
    if (k3_make_tiny_checkpoint(&o, &err)) return cli_fail_err("make-tiny", &err);
    fprintf(stderr, "k3 make-tiny: wrote %s (%s, %s, seed %llu)\n", o.dir, o.preset, o.format,
            (unsigned long long)o.seed);
    return 0;
}
