/* make-tiny's tokenizer files: tiktoken.model (one "base64(token bytes) rank" line per
 * token, the format Kimi K3 ships, k3-architecture.md §7.1) and tokenizer_config.json with
 * the 256 specials at the end of the vocabulary in K3's order ([BOS] at base+0,
 * <|end_of_msg|> at base+2, [PAD] at base+255, unnamed ones <|reserved_token_ID|>).
 *
 * The vocabulary is 256 single bytes plus merges learned by plain byte-pair encoding on a
 * short built-in English text, so every merged token is the concatenation of two
 * lower-ranked tokens, as tiktoken's merge loop requires. It is a toy: enough to exercise a
 * real BPE encoder, not to tokenize well. */
#include "load/tiny.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char corpus[] =
    "the quick brown fox jumps over the lazy dog. a model reads the text and writes the next "
    "token. kimi is a mixture of experts model with linear attention and latent experts. "
    "the router picks the top experts for every token, and the experts run in four bits. "
    "hello world! this is a tiny model for tests; it knows nothing, but it runs the same "
    "code as the large one. numbers like 123 and 4567 are split into short pieces. "
    "when the user asks a question, the assistant answers with care and stops at the end "
    "of the message. there are many layers, heads and experts, and each one has weights. ";

typedef struct tok { unsigned char b[64]; int len; } tok;

static void b64(const unsigned char *s, int n, char *out) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int o = 0;
    for (int i = 0; i < n; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        out[o++] = t[v >> 18 & 63];
        out[o++] = t[v >> 12 & 63];
        out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = 0;
}

static const char *special_name(int k, char *buf, size_t n, int64_t id) {
    switch (k) {
    case 0: return "[BOS]";
    case 1: return "[EOS]";
    case 2: return "<|end_of_msg|>";
    case 3: return "<|open|>";
    case 4: return "<|close|>";
    case 5: return "<|sep|>";
    case 6: return "[start_header_id]";
    case 7: return "[end_header_id]";
    case 9: return "[EOT]";
    case 18: return "<|media_begin|>";
    case 19: return "<|media_content|>";
    case 20: return "<|media_end|>";
    case 21: return "<|media_pad|>";
    case 254: return "[UNK]";
    case 255: return "[PAD]";
    default: snprintf(buf, n, "<|reserved_token_%lld|>", (long long)id); return buf;
    }
}

int k3_tiny_write_tokenizer(const char *dir, int64_t vocab, k3_error *err) {
    int64_t base = vocab - 256;
    if (base < 256 || base > 4096)
        return k3_fail(err, K3_ERR_ARG, "make-tiny: vocab_size %lld: expected 512..4352 for the toy "
                       "tokenizer", (long long)vocab);
    /* BPE over the corpus split into words (a space attaches to the word after it) */
    size_t n = sizeof corpus - 1;
    int *seq = malloc(n * sizeof *seq);
    tok *v = calloc((size_t)base, sizeof *v);
    if (!seq || !v) {
        free(seq), free(v);
        return k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
    }
    for (int i = 0; i < 256; i++) v[i].b[0] = (unsigned char)i, v[i].len = 1;
    for (size_t i = 0; i < n; i++) seq[i] = (unsigned char)corpus[i];
    int64_t nv = 256;
    size_t len = n;
    while (nv < base) {
        int best_a = -1, best_b = -1, best = 1;
        /* O(len^2) counting is fine for a 900-byte corpus */
        for (size_t i = 0; i + 1 < len; i++) {
            if (seq[i + 1] == ' ') continue; /* never merge across a word start */
            if (v[seq[i]].len + v[seq[i + 1]].len > 63) continue;
            int c = 0;
            for (size_t j = i; j + 1 < len; j++)
                if (seq[j] == seq[i] && seq[j + 1] == seq[i + 1]) c++;
            if (c > best) best = c, best_a = seq[i], best_b = seq[i + 1];
        }
        if (best_a < 0) break; /* corpus exhausted: fill the rest with byte pairs below */
        tok *t = &v[nv];
        memcpy(t->b, v[best_a].b, (size_t)v[best_a].len);
        memcpy(t->b + v[best_a].len, v[best_b].b, (size_t)v[best_b].len);
        t->len = v[best_a].len + v[best_b].len;
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
            if (i + 1 < len && seq[i] == best_a && seq[i + 1] == best_b) seq[o++] = (int)nv, i++;
            else seq[o++] = seq[i];
        }
        len = o;
        nv++;
    }
    /* any remaining ranks: two-letter lowercase pairs not yet present, in order */
    for (int a = 'a'; a <= 'z' && nv < base; a++)
        for (int b = 'a'; b <= 'z' && nv < base; b++) {
            bool have = false;
            for (int64_t k = 256; k < nv && !have; k++)
                have = v[k].len == 2 && v[k].b[0] == a && v[k].b[1] == b;
            if (!have) v[nv].b[0] = (unsigned char)a, v[nv].b[1] = (unsigned char)b, v[nv++].len = 2;
        }
    free(seq);
    char path[4096];
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    FILE *f = fopen(path, "w");
    int rc = K3_OK;
    if (!f) rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    for (int64_t i = 0; i < nv && !rc; i++) {
        char enc[100];
        b64(v[i].b, v[i].len, enc);
        if (fprintf(f, "%s %lld\n", enc, (long long)i) < 0)
            rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (f && fclose(f) && !rc) rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    free(v);
    if (rc) return rc;
    if (nv != base)
        return k3_fail(err, K3_ERR_INTERNAL, "make-tiny: tokenizer has %lld base tokens, expected %lld",
                       (long long)nv, (long long)base);
    cJSON *j = cJSON_CreateObject(), *dec = cJSON_AddObjectToObject(j, "added_tokens_decoder");
    for (int k = 0; k < 256; k++) {
        char buf[64], id[24];
        snprintf(id, sizeof id, "%lld", (long long)(base + k));
        cJSON *t = cJSON_AddObjectToObject(dec, id);
        cJSON_AddStringToObject(t, "content", special_name(k, buf, sizeof buf, base + k));
        cJSON_AddBoolToObject(t, "lstrip", 0);
        cJSON_AddBoolToObject(t, "normalized", 0);
        cJSON_AddBoolToObject(t, "rstrip", 0);
        cJSON_AddBoolToObject(t, "single_word", 0);
        cJSON_AddBoolToObject(t, "special", 1);
    }
    cJSON_AddStringToObject(j, "bos_token", "[BOS]");
    cJSON_AddStringToObject(j, "eos_token", "[EOS]");
    cJSON_AddStringToObject(j, "pad_token", "[PAD]");
    cJSON_AddStringToObject(j, "unk_token", "[UNK]");
    cJSON_AddNumberToObject(j, "model_max_length", 1048576);
    cJSON_AddStringToObject(j, "tokenizer_class", "TikTokenTokenizer");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = s ? fopen(path, "w") : NULL;
    if (!s) rc = k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
    else if (!f || fputs(s, f) < 0 || fputc('\n', f) < 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    if (f && fclose(f) && !rc) rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    free(s);
    return rc;
}
