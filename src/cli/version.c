/* k3 version: what this binary is, so benchmark tables and bug reports can name the build. */
#include "cli/cli.h"

#include <stdio.h>

int cli_version(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: k3 version\n");
        return 1;
    }
    printf("k3 %s (commit %s, backends: cpu%s)\n", k3_version(), k3_build_commit(),
           k3_have_cuda() ? ", cuda, cuda-fused" : "");
    return 0;
}
