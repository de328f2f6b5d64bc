/* The CLI's command table. Each command lives in its own file (src/cli/<name>.c) and has
 * the signature of k3_cli_fn: it parses its own flags (llama.cpp-style, each with a long
 * form and its default in -h), prints errors to stderr and returns the process exit status.
 * Commands include only k3.h and this header. */
#ifndef K3_CLI_H
#define K3_CLI_H

#include "k3.h"

typedef int (*k3_cli_fn)(int argc, char **argv);

int cli_version(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_make_tiny(int argc, char **argv);
int cli_moe(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_bench(int argc, char **argv);

/* Prints "k3 <cmd>: <message>" to stderr and returns 1 (exit status for bad input). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints a k3_error from the library the same way; returns 1. */
int cli_fail_err(const char *cmd, const k3_error *err);

/* Whether argument s is the flag short_form (may be NULL: no short form) or long_form. */
int cli_is_opt(const char *s, const char *short_form, const char *long_form);

/* The value of the option at argv[*i], advancing *i past it; NULL after printing
 * "<option>: missing value" when it is the last argument. Telling that apart from an unknown
 * option is why commands match the option first and take its value second. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* Prints "k3 <cmd>: unknown option '<opt>' (see k3 <cmd> -h)"; returns 1. */
int cli_fail_unknown(const char *cmd, const char *opt);

/* Strict numeric flag parsing: the whole string must be a number in range, else an error
 * naming the flag. */
int cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *cmd, const char *flag, const char *s, double *out);

#endif
