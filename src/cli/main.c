/* k3: the command-line front-end. main() picks a command from the table and runs it; only
 * main exits. stdout carries requested output only; diagnostics go to stderr. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    k3_cli_fn fn;
    const char *summary;
} commands[] = {
    {"version", cli_version, "print version, build commit and compiled backends"},
    {"inspect", cli_inspect, "list a checkpoint's tensors, shards, totals and quantization"},
    {"quantize", cli_quantize, "convert a BF16 checkpoint to nvfp4 / nvfp4-ct / mxfp4 / fp8-block"},
    {"make-tiny", cli_make_tiny, "write a seeded Kimi-K3-architecture checkpoint (tiny/small/k3-layer)"},
    {"moe", cli_moe, "run one MoE layer of a checkpoint on tokens from a safetensors file"},
    {"bench", cli_bench, "benchmarks with their floors: bench moe"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: k3 <command> [options]   (k3 <command> -h for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "k3: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}

int cli_fail(const char *cmd, const char *fmt, ...) {
    fprintf(stderr, "k3 %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int cli_fail_err(const char *cmd, const k3_error *err) {
    return cli_fail(cmd, "%s: %s", k3_status_str(err->status), err->msg);
}

int cli_is_opt(const char *s, const char *short_form, const char *long_form) {
    return (short_form && !strcmp(s, short_form)) || !strcmp(s, long_form);
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_fail(cmd, "%s: missing value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_fail_unknown(const char *cmd, const char *opt) {
    return cli_fail(cmd, "unknown option '%s' (see k3 %s -h)", opt, cmd);
}

int cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return cli_fail(cmd, "%s: expected an integer in [%ld, %ld], got '%s'", flag, lo, hi,
                        s ? s : "(nothing)");
    *out = v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v))
        return cli_fail(cmd, "%s: expected a finite number, got '%s'", flag, s ? s : "(nothing)");
    *out = v;
    return 0;
}
