/* vocab.c — every split of a vocabulary's tokens into two of its tokens.
 *
 * A SentencePiece vocabulary stored with scores but no merges (Gemma's GGUF files) gets its BPE
 * merges rebuilt from these splits (pyllm/tokenizer_gguf.py). Gemma 3 has 262,144 tokens and
 * ~1.2 million cuts; slicing and looking up each in Python took 2.4 s of a 2.9 s load. Here each
 * cut costs two probes of a hash table: a token's prefix hashes give the left part's hash and,
 * by subtraction, the right part's, so the whole is linear in the vocabulary's bytes (a token of
 * two million characters included), and every match is confirmed byte for byte.
 */
#include <stdlib.h>
#include <string.h>

#include "pyllm.h"

/* Polynomial hash of bytes: H(s) = Σ s_i · B^(len-1-i) modulo 2^64, so that for a cut at p
 * H(s[p:]) = H(s) - H(s[:p]) · B^(len-p). */
#define HASH_BASE 0x100000001B3ull

/* A table slot from a hash and a length: the polynomial hash's low bits depend on the bytes' low
 * bits only, so it is mixed first (the finalizer of MurmurHash3). */
static uint64_t slot_of(uint64_t h, int64_t len) {
    h ^= (uint64_t)len * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
}

/* A slot holds what a probe compares, so that a miss reads one cache line and a hit one more (the
 * bytes). */
typedef struct {
    uint64_t hash;
    int64_t at;  /* the token's first byte */
    int32_t len; /* its bytes; -1: an empty slot */
    int32_t token;
} vocab_slot;

typedef struct {
    const char *bytes;
    vocab_slot *slots;
    int64_t mask; /* slots - 1, a power of two at least twice the tokens */
} vocab_table;

/* The token whose bytes are s[0, len) (hash h), or -1. */
static int64_t lookup(const vocab_table *v, uint64_t h, const char *s, int64_t len) {
    for (int64_t i = (int64_t)(slot_of(h, len) & (uint64_t)v->mask);; i = (i + 1) & v->mask) {
        const vocab_slot *e = &v->slots[i];
        if (e->len < 0) return -1;
        if (e->hash == h && e->len == len && memcmp(v->bytes + e->at, s, (size_t)len) == 0) return e->token;
    }
}

static uint64_t hash_bytes(const char *s, int64_t len) {
    uint64_t h = 0;
    for (int64_t i = 0; i < len; i++) h = h * HASH_BASE + (unsigned char)s[i];
    return h;
}

static int grow(int64_t **p, int64_t n) {
    int64_t *q = realloc(*p, (size_t)n * sizeof **p);
    if (q) *p = q;
    return q != NULL;
}

/* Appends a split to out, its arrays grown by half again when full; 0 when memory ran out. */
static int append_split(pl_vocab_split_list *out, int64_t *cap, int64_t t, int64_t cut, int64_t a, int64_t b) {
    if (out->n == *cap) {
        int64_t grown = *cap < 1024 ? 1024 : *cap + *cap / 2;
        if (!grow(&out->which, grown) || !grow(&out->cut, grown) || !grow(&out->left, grown) ||
            !grow(&out->right, grown))
            return 0;
        *cap = grown;
    }
    out->which[out->n] = t, out->cut[out->n] = cut, out->left[out->n] = a, out->right[out->n] = b;
    out->n++;
    return 1;
}

void pl_vocab_split_list_free(pl_vocab_split_list *out) {
    free(out->which);
    free(out->cut);
    free(out->left);
    free(out->right);
    memset(out, 0, sizeof *out);
}

int pl_vocab_splits(const char *bytes, const int64_t *offsets, int64_t n, pl_vocab_split_list *out) {
    memset(out, 0, sizeof *out);
    if (n > INT32_MAX) return PL_ERR_ARGS;
    int64_t slots = 16, longest = 0, cap = 0;
    while (slots < 2 * n) slots *= 2;
    for (int64_t t = 0; t < n; t++) {
        int64_t len = offsets[t + 1] - offsets[t];
        if (len > INT32_MAX) return PL_ERR_ARGS;
        longest = len > longest ? len : longest;
    }
    vocab_table v = {bytes, malloc((size_t)slots * sizeof(vocab_slot)), slots - 1};
    uint64_t *prefix = malloc((size_t)(longest + 1) * sizeof *prefix); /* one token's H(s[:p]) */
    uint64_t *power = malloc((size_t)(longest + 1) * sizeof *power);   /* B^p */
    int rc = PL_ERR_NOMEM;
    if (!v.slots || !prefix || !power) goto done;
    for (int64_t i = 0; i < slots; i++) v.slots[i].len = -1;
    power[0] = 1;
    for (int64_t p = 1; p <= longest; p++) power[p] = power[p - 1] * HASH_BASE;
    for (int64_t t = 0; t < n; t++) { /* the first of equal tokens keeps its slot */
        const char *s = bytes + offsets[t];
        int64_t len = offsets[t + 1] - offsets[t];
        uint64_t h = hash_bytes(s, len);
        if (lookup(&v, h, s, len) >= 0) continue;
        int64_t i = (int64_t)(slot_of(h, len) & (uint64_t)v.mask);
        while (v.slots[i].len >= 0) i = (i + 1) & v.mask;
        vocab_slot e = {h, offsets[t], (int32_t)len, (int32_t)t};
        v.slots[i] = e;
    }
    for (int64_t t = 0; t < n; t++) {
        const char *s = bytes + offsets[t];
        int64_t len = offsets[t + 1] - offsets[t], chars = 0;
        prefix[0] = 0;
        for (int64_t p = 0; p < len; p++) prefix[p + 1] = prefix[p] * HASH_BASE + (unsigned char)s[p];
        for (int64_t p = 1; p < len; p++) {
            if (((unsigned char)s[p - 1] & 0xC0) != 0x80) chars++; /* code points in s[:p] */
            if (((unsigned char)s[p] & 0xC0) == 0x80) continue;    /* inside a code point: no cut */
            int64_t a = lookup(&v, prefix[p], s, p);
            if (a < 0) continue;
            int64_t b = lookup(&v, prefix[len] - prefix[p] * power[len - p], s + p, len - p);
            if (b >= 0 && !append_split(out, &cap, t, chars, a, b)) goto done;
        }
    }
    rc = PL_OK;
done:
    if (rc != PL_OK) pl_vocab_split_list_free(out);
    free(v.slots);
    free(prefix);
    free(power);
    return rc;
}
