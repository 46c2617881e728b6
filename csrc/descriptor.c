/*
 * Fast path for reading descriptors: a strict JSON scanner and a column
 * extractor for the `tensors` arrays of TensorLists.
 *
 * Python's json module builds a dict per tensor; for a million tensors that
 * is seconds. Here the whole document is checked in one pass (strict JSON:
 * one value, no duplicate keys, no NaN/Infinity, finite numbers), the byte
 * spans of TensorLists' `tensors` arrays are reported, and each array is then
 * read straight into columns. Anything unusual (escaped keys, very long
 * numbers, deep nesting, a rule broken) returns TL_ERR_FALLBACK or
 * TL_ERR_FORMAT, and the caller re-reads the document with the exact (slow)
 * Python validator, which produces the error message. So this code only has
 * to be right about accepting, never about explaining.
 */
#include "tensorlist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 256
#define MAX_NUMBER_CHARS 64

typedef struct {
    const unsigned char *base, *p, *end;
    int depth;
    uint64_t *spans;      /* out: pairs (start, end) of tensors arrays */
    uint64_t max_spans, n_spans;
    int status;
    int array_all_objects; /* set by scan_array: every element of the array just scanned is an object */
} scanner;

typedef struct {
    const unsigned char *start;
    uint64_t len;
} key_span;

/* The hot loops below work on local copies of s->p and s->end: a store
 * through the unsigned char pointer may alias *s, so the compiler would
 * otherwise reload both from memory for every byte (3x slower scans). */
static void ws(scanner *s) {
    const unsigned char *p = s->p, *end = s->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    s->p = p;
}

static int fail(scanner *s, int status) {
    if (s->status == TL_OK) s->status = status;
    return status;
}

static int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* After the opening quote; leaves p after the closing quote. */
static int scan_string(scanner *s, const unsigned char **start, uint64_t *len, int *escaped) {
    const unsigned char *b = s->p;
    *escaped = 0;
    {
        const unsigned char *p = s->p, *end = s->end; /* skip plain characters */
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
        s->p = p;
    }
    while (s->p < s->end) {
        unsigned char c = *s->p;
        if (c == '"') {
            *start = b;
            *len = (uint64_t)(s->p - b);
            s->p++;
            return TL_OK;
        }
        if (c < 0x20) return fail(s, TL_ERR_JSON);
        if (c == '\\') {
            *escaped = 1;
            if (s->p + 1 >= s->end) return fail(s, TL_ERR_JSON);
            unsigned char e = s->p[1];
            if (e == 'u') {
                if (s->end - s->p < 6 || !is_hex(s->p[2]) || !is_hex(s->p[3]) || !is_hex(s->p[4]) ||
                    !is_hex(s->p[5]))
                    return fail(s, TL_ERR_JSON);
                s->p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return fail(s, TL_ERR_JSON);
            s->p += 2;
            continue;
        }
        s->p++;
    }
    return fail(s, TL_ERR_JSON);
}

/* Scans a number; *is_int says it has no fraction or exponent. */
static int scan_number(scanner *s, int *is_int) {
    const unsigned char *b = s->p, *p = s->p, *end = s->end;
    int integral = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) goto bad;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        goto bad;
    }
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') goto bad;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') goto bad;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    *is_int = integral;
    goto scanned;
bad:
    s->p = p;
    *is_int = integral;
    return fail(s, TL_ERR_JSON);
scanned:;
    uint64_t n = (uint64_t)(s->p - b);
    if (n > MAX_NUMBER_CHARS) return fail(s, TL_ERR_FALLBACK); /* let Python judge huge numbers */
    if (!*is_int) {
        char buf[MAX_NUMBER_CHARS + 1];
        memcpy(buf, b, (size_t)n);
        buf[n] = 0;
        /* strtod may honour the C locale's decimal point; JSON's is '.', and
           Python programs run in the "C" numeric locale unless changed. */
        double v = strtod(buf, NULL);
        if (isinf(v)) return fail(s, TL_ERR_JSON);
    }
    return TL_OK;
}

static int scan_value(scanner *s, int *kind);

static int key_cmp(const void *a, const void *b) {
    const key_span *x = a, *y = b;
    uint64_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->start, y->start, (size_t)m);
    if (c) return c;
    return x->len < y->len ? -1 : (x->len > y->len);
}

enum { K_OBJECT = 1, K_ARRAY, K_STRING, K_INT, K_FLOAT, K_LITERAL };

#define KEY_MATCH(st, ln, lit) ((ln) == sizeof(lit) - 1 && memcmp((st), (lit), sizeof(lit) - 1) == 0)

static int scan_object(scanner *s) {
    key_span small[16];
    key_span *keys = small;
    uint64_t nkeys = 0, cap = 16;
    int has_location = 0, has_offset = 0, has_length = 0;
    uint64_t tensors_start = 0, tensors_end = 0;
    int tensors_all_objects = 0;
    int rc = TL_OK;
    s->p++; /* '{' */
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return TL_OK;
    }
    for (;;) {
        ws(s);
        if (s->p >= s->end || *s->p != '"') {
            rc = fail(s, TL_ERR_JSON);
            break;
        }
        s->p++;
        const unsigned char *ks;
        uint64_t kl;
        int esc;
        if ((rc = scan_string(s, &ks, &kl, &esc))) break;
        if (esc) { /* "a" and "\u0061" are the same key: leave it to Python */
            rc = fail(s, TL_ERR_FALLBACK);
            break;
        }
        if (nkeys == cap) {
            key_span *grown = malloc((size_t)(cap * 2) * sizeof(key_span));
            if (!grown) {
                rc = fail(s, TL_ERR_NOMEM);
                break;
            }
            memcpy(grown, keys, (size_t)nkeys * sizeof(key_span));
            if (keys != small) free(keys);
            keys = grown;
            cap *= 2;
        }
        keys[nkeys].start = ks;
        keys[nkeys].len = kl;
        nkeys++;
        ws(s);
        if (s->p >= s->end || *s->p != ':') {
            rc = fail(s, TL_ERR_JSON);
            break;
        }
        s->p++;
        ws(s);
        uint64_t vstart = (uint64_t)(s->p - s->base);
        int kind = 0;
        if ((rc = scan_value(s, &kind))) break;
        if (KEY_MATCH(ks, kl, "location")) has_location = kind == K_STRING;
        else if (KEY_MATCH(ks, kl, "byteOffset")) has_offset = kind == K_INT;
        else if (KEY_MATCH(ks, kl, "byteLength")) has_length = kind == K_INT;
        else if (KEY_MATCH(ks, kl, "tensors") && kind == K_ARRAY) {
            tensors_start = vstart;
            tensors_end = (uint64_t)(s->p - s->base);
            tensors_all_objects = s->array_all_objects; /* from the scan_array that just returned */
        }
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            break;
        }
        rc = fail(s, TL_ERR_JSON);
        break;
    }
    if (rc == TL_OK && nkeys > 1) {
        if (nkeys <= 16) {
            for (uint64_t i = 1; i < nkeys && rc == TL_OK; i++)
                for (uint64_t j = 0; j < i; j++)
                    if (keys[i].len == keys[j].len && memcmp(keys[i].start, keys[j].start, (size_t)keys[i].len) == 0) {
                        rc = fail(s, TL_ERR_JSON);
                        break;
                    }
        } else {
            qsort(keys, (size_t)nkeys, sizeof(key_span), key_cmp);
            for (uint64_t i = 1; i < nkeys; i++)
                if (key_cmp(&keys[i - 1], &keys[i]) == 0) {
                    rc = fail(s, TL_ERR_JSON);
                    break;
                }
        }
    }
    if (rc == TL_OK && tensors_end && tensors_all_objects && has_location && has_offset && has_length) {
        if (s->n_spans == s->max_spans) {
            rc = fail(s, TL_ERR_FALLBACK);
        } else {
            s->spans[2 * s->n_spans] = tensors_start;
            s->spans[2 * s->n_spans + 1] = tensors_end;
            s->n_spans++;
        }
    }
    if (keys != small) free(keys);
    return rc;
}

static int scan_array(scanner *s) {
    int all_objects = 1;
    s->p++; /* '[' */
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        s->array_all_objects = 1;
        return TL_OK;
    }
    for (;;) {
        int kind;
        ws(s);
        int rc = scan_value(s, &kind);
        if (rc) return rc;
        all_objects &= kind == K_OBJECT;
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            s->array_all_objects = all_objects; /* after the elements' own arrays set it */
            return TL_OK;
        }
        return fail(s, TL_ERR_JSON);
    }
}

static int scan_literal(scanner *s, const char *lit, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return fail(s, TL_ERR_JSON);
    s->p += n;
    return TL_OK;
}

static int scan_value(scanner *s, int *kind) {
    int rc;
    if (s->p >= s->end) return fail(s, TL_ERR_JSON);
    if (++s->depth > MAX_DEPTH) return fail(s, TL_ERR_FALLBACK);
    switch (*s->p) {
    case '{':
        *kind = K_OBJECT;
        rc = scan_object(s);
        break;
    case '[':
        *kind = K_ARRAY;
        rc = scan_array(s);
        break;
    case '"': {
        const unsigned char *st;
        uint64_t ln;
        int esc;
        *kind = K_STRING;
        s->p++;
        rc = scan_string(s, &st, &ln, &esc);
        break;
    }
    case 't':
        *kind = K_LITERAL;
        rc = scan_literal(s, "true", 4);
        break;
    case 'f':
        *kind = K_LITERAL;
        rc = scan_literal(s, "false", 5);
        break;
    case 'n':
        *kind = K_LITERAL;
        rc = scan_literal(s, "null", 4);
        break;
    default: {
        int is_int;
        rc = scan_number(s, &is_int);
        *kind = is_int ? K_INT : K_FLOAT;
    }
    }
    s->depth--;
    return rc;
}

int tl_json_scan(const char *text, uint64_t length, uint64_t *spans, uint64_t max_spans,
                 uint64_t *n_spans, uint64_t *error_pos) {
    if (!text || !spans || !n_spans || !error_pos) return TL_ERR_ARG;
    scanner s = {(const unsigned char *)text, (const unsigned char *)text,
                 (const unsigned char *)text + length, 0, spans, max_spans, 0, TL_OK, 0};
    int kind;
    ws(&s);
    int rc = scan_value(&s, &kind);
    if (rc == TL_OK) {
        ws(&s);
        if (s.p != s.end) rc = fail(&s, TL_ERR_JSON); /* exactly one value */
    }
    *n_spans = s.n_spans;
    *error_pos = (uint64_t)(s.p - s.base);
    return rc ? s.status : TL_OK;
}

/* ------------------------------------------------------ tensors -> columns */

/* A non-negative JSON integer that fits int64; anything else is a rule for Python. */
static int read_uint(scanner *s, int64_t *out) {
    const unsigned char *b = s->p;
    int is_int;
    if (s->p < s->end && *s->p == '-') return TL_ERR_FORMAT;
    if (scan_number(s, &is_int)) return TL_ERR_FORMAT;
    if (!is_int) return TL_ERR_FORMAT;
    int64_t v = 0;
    for (const unsigned char *q = b; q < s->p; q++) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (int64_t)(*q - '0'), &v))
            return TL_ERR_FORMAT;
    }
    *out = v;
    return TL_OK;
}

int tl_parse_tensors(const char *text, uint64_t start, uint64_t end, const int64_t *itemsize_by_code,
                     uint64_t capacity, int64_t *codes, int64_t *offsets, int64_t *lengths, int64_t *crcs,
                     int64_t *ndims, int64_t *dims, uint64_t dims_capacity, char *names,
                     uint64_t names_capacity, uint8_t *name_flags, uint64_t *n_tensors, uint64_t *n_dims,
                     uint64_t *names_used, int64_t *bad) {
    if (!text || !itemsize_by_code || !n_tensors || !n_dims || !names_used || !bad || end <= start)
        return TL_ERR_ARG;
    int fill = codes != NULL;
    /* names and dims may be NULL when their capacities are 0 (no names, only scalars) */
    if (fill && (!offsets || !lengths || !crcs || !ndims || !name_flags || (!dims && dims_capacity) ||
                 (!names && names_capacity)))
        return TL_ERR_ARG;
    scanner s = {(const unsigned char *)text, (const unsigned char *)text + start,
                 (const unsigned char *)text + end, 0, NULL, 0, 0, TL_OK, 0};
    uint64_t n = 0, nd = 0, nu = 0;
    *bad = -1;
    if (*s.p != '[') return TL_ERR_ARG;
    s.p++;
    ws(&s);
    if (*s.p == ']') {
        *n_tensors = *n_dims = *names_used = 0;
        return TL_OK;
    }
    for (;;) {
        ws(&s);
        if (*s.p != '{') return TL_ERR_FORMAT;
        s.p++;
        int64_t code = -1, off = -1, len = -1, crc = -1, ndim = 0;
        uint64_t numel = 1;
        int overflow = 0, named = 0;
        *bad = (int64_t)n;
        if (fill && n >= capacity) return TL_ERR_ARG;
        ws(&s);
        if (*s.p != '}') {
            for (;;) {
                ws(&s);
                const unsigned char *ks;
                uint64_t kl;
                int esc;
                s.p++; /* '"' (the document was scanned already) */
                if (scan_string(&s, &ks, &kl, &esc)) return TL_ERR_FORMAT;
                ws(&s);
                s.p++; /* ':' */
                ws(&s);
                int rc = TL_OK;
                if (KEY_MATCH(ks, kl, "dataType")) rc = read_uint(&s, &code);
                else if (KEY_MATCH(ks, kl, "byteOffset")) rc = read_uint(&s, &off);
                else if (KEY_MATCH(ks, kl, "byteLength")) rc = read_uint(&s, &len);
                else if (KEY_MATCH(ks, kl, "crc32c")) {
                    rc = read_uint(&s, &crc);
                    if (rc == TL_OK && crc > 0xFFFFFFFFLL) rc = TL_ERR_FORMAT;
                } else if (KEY_MATCH(ks, kl, "name")) {
                    if (*s.p != '"') return TL_ERR_FORMAT;
                    s.p++;
                    const unsigned char *vs;
                    uint64_t vl;
                    int vesc;
                    if (scan_string(&s, &vs, &vl, &vesc)) return TL_ERR_FORMAT;
                    named = 1;
                    if (fill) {
                        if (nu + vl + 1 > names_capacity) return TL_ERR_ARG;
                        memcpy(names + nu, vs, (size_t)vl);
                        names[nu + vl] = 0;
                        name_flags[n] = (uint8_t)(1 | (vesc ? 2 : 0));
                    }
                    nu += vl + 1;
                } else if (KEY_MATCH(ks, kl, "dims")) {
                    if (*s.p != '[') return TL_ERR_FORMAT;
                    s.p++;
                    ws(&s);
                    ndim = 0;
                    if (*s.p == ']') {
                        s.p++;
                    } else {
                        for (;;) {
                            int64_t d;
                            ws(&s);
                            if (read_uint(&s, &d)) return TL_ERR_FORMAT;
                            if (fill) {
                                if (nd >= dims_capacity) return TL_ERR_ARG;
                                dims[nd] = d;
                            }
                            nd++;
                            ndim++;
                            if (__builtin_mul_overflow(numel, (uint64_t)d, &numel)) overflow = 1;
                            ws(&s);
                            if (*s.p == ',') {
                                s.p++;
                                continue;
                            }
                            if (*s.p == ']') {
                                s.p++;
                                break;
                            }
                            return TL_ERR_FORMAT;
                        }
                    }
                } else {
                    int kind;
                    rc = scan_value(&s, &kind); /* an extension key: skip its value */
                }
                if (rc) return TL_ERR_FORMAT;
                ws(&s);
                if (*s.p == ',') {
                    s.p++;
                    continue;
                }
                if (*s.p == '}') break;
                return TL_ERR_FORMAT;
            }
        }
        s.p++; /* '}' */
        if (code < 0 || off < 0 || len < 0 || code > 255) return TL_ERR_FORMAT;
        int64_t itemsize = itemsize_by_code[code];
        uint64_t bytes;
        if (itemsize <= 0 || overflow || __builtin_mul_overflow(numel, (uint64_t)itemsize, &bytes) ||
            bytes != (uint64_t)len)
            return TL_ERR_FORMAT;
        if (fill) {
            codes[n] = code;
            offsets[n] = off;
            lengths[n] = len;
            crcs[n] = crc;
            ndims[n] = ndim;
            if (!named) name_flags[n] = 0;
        }
        n++;
        ws(&s);
        if (*s.p == ',') {
            s.p++;
            continue;
        }
        if (*s.p == ']') break;
        return TL_ERR_FORMAT;
    }
    *n_tensors = n;
    *n_dims = nd;
    *names_used = nu;
    *bad = -1;
    return TL_OK;
}
