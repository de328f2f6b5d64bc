/* k3 version: what this binary is, so benchmark tables and bug reports can name the build. */
#include "cli/cli.h"

#include <stdio.h>

static void usage(FILE *f) {
    fprintf(f, "usage: k3 version\n"
               "  prints the version, the build commit and the backends compiled in\n");
}

int cli_version(int argc, char **argv) {
    if (argc > 1) {
        if (cli_is_opt(argv[1], "-h", "--help")) {
            usage(stdout);
            return 0;
        }
        if (argv[1][0] == '-') return cli_fail_unknown("version", argv[1]);
        return cli_fail("version", "unexpected argument '%s' (k3 version takes none)", argv[1]);
    }
    printf("k3 %s (commit %s, backends: cpu%s)\n", k3_version(), k3_build_commit(),
           k3_have_cuda() ? ", cuda, cuda-fused" : "");
    return 0;
}
