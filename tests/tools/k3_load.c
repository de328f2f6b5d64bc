/* k3_load DIR [EP_SIZE EP_RANK THREADS]: loads a checkpoint through k3_model_open and prints
 * one line: bytes read, seconds, GB/s and the process's peak RSS (VmHWM). For measuring the
 * loader (report numbers) and for Python tests; not part of the product. */
#include "k3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long vm_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key) + 1);
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 5) {
        fprintf(stderr, "usage: k3_load DIR [EP_SIZE EP_RANK THREADS]\n");
        return 2;
    }
    k3_model_opts o = {.path = argv[1], .progress = 1};
    if (argc == 5) o.ep_size = atoi(argv[2]), o.ep_rank = atoi(argv[3]), o.n_threads = atoi(argv[4]);
    long base = vm_kb("VmRSS:");
    k3_model *m = NULL;
    k3_error e = {0};
    if (k3_model_open(&m, &o, &e)) {
        fprintf(stderr, "k3_load: %s: %s\n", k3_status_str(e.status), e.msg);
        return 1;
    }
    k3_model_info i;
    k3_model_get_info(m, &i);
    printf("read %.3f GB kept %.3f GB in %.3f s = %.2f GB/s; experts %d..%d of %d; peak RSS %.3f GB "
           "(+%.3f GB over start)\n",
           i.bytes_read / 1e9, i.bytes_kept / 1e9, i.load_seconds, i.bytes_read / i.load_seconds / 1e9,
           i.ep_first, i.ep_first + i.ep_count - 1, i.n_experts, vm_kb("VmHWM:") * 1024 / 1e9,
           (vm_kb("VmHWM:") - base) * 1024 / 1e9);
    k3_model_close(m);
    return 0;
}
