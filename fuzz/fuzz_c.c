/*
 * libFuzzer target for the C core's descriptor and layout code:
 * tl_json_scan -> tl_parse_tensors (count, then fill) -> tl_check_layout,
 * and tl_check_layout against a brute-force reference on raw spans.
 *
 *   make -C fuzz run RUNS=200000      (clang -fsanitize=fuzzer,address,undefined)
 *
 * Inputs whose first byte is '{', '[' or whitespace are descriptors; others are read as
 * (list_length, then offset/length/itemsize triples) for the layout check. The buffer libFuzzer
 * hands over has exactly the input's length and no NUL after it, so any read past the end is an
 * ASan report. A -DTL_STANDALONE build (standalone.c) runs the same code over files, for valgrind.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensorlist.h"

#define MAX_SPANS 64
#define MAX_TENSORS 4096

static int64_t itemsize_by_code[256];

static void init_table(void) {
    static const int codes[][2] = {{0, 1},  {1, 1},  {2, 2},  {3, 4},  {4, 8},  {5, 2},  {6, 4},
                                   {7, 8},  {9, 8},  {10, 16}, {11, 1}, {15, 2}, {23, 1}, {24, 1},
                                   {25, 1}, {26, 1}, {27, 2}, {28, 4}, {29, 8}, {44, 1}};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) itemsize_by_code[codes[i][0]] = codes[i][1];
}

static void check(int cond) {
    if (!cond) abort();
}

/* O(n^2) reference: the status tl_check_layout must give (0 ok, else any error). */
static int reference_layout(uint64_t n, const tl_span *s, int64_t list_length) {
    for (uint64_t i = 0; i < n; i++) {
        if (s[i].itemsize <= 0) return TL_ERR_ARG;
        if (s[i].offset < 0 || s[i].length < 0) return TL_ERR_BOUNDS;
        if (s[i].offset % 8 || s[i].offset % s[i].itemsize) return TL_ERR_ALIGN;
        if (s[i].length % s[i].itemsize) return TL_ERR_LENGTH;
        if (s[i].length > INT64_MAX - s[i].offset) return TL_ERR_OVERFLOW;
        if (s[i].offset + s[i].length > list_length) return TL_ERR_BOUNDS;
    }
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = i + 1; j < n; j++)
            if (s[i].length && s[j].length && s[i].offset < s[j].offset + s[j].length &&
                s[j].offset < s[i].offset + s[i].length)
                return TL_ERR_OVERLAP;
    return TL_OK;
}

static void layout_case(uint64_t n, const tl_span *spans, int64_t list_length) {
    int64_t bad, other;
    int st = tl_check_layout(n, spans, list_length, 8, &bad, &other);
    int ref = reference_layout(n, spans, list_length);
    check((st == TL_OK) == (ref == TL_OK));
    if (st != TL_OK) check(bad >= 0 && (uint64_t)bad < n);
    if (st == TL_ERR_OVERLAP) check(other >= 0 && (uint64_t)other < n && other != bad);
}

static void descriptor_case(const char *text, size_t size) {
    uint64_t spans[2 * MAX_SPANS], n_spans = 0, pos = 0;
    int st = tl_json_scan(text, size, spans, MAX_SPANS, &n_spans, &pos);
    if (st != TL_OK) return;
    check(n_spans <= MAX_SPANS);
    for (uint64_t k = 0; k < n_spans; k++) {
        uint64_t a = spans[2 * k], b = spans[2 * k + 1];
        check(a < b && b <= size && text[a] == '[' && text[b - 1] == ']');
        uint64_t n = 0, nd = 0, nu = 0;
        int64_t bad;
        st = tl_parse_tensors(text, a, b, itemsize_by_code, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, 0,
                              NULL, &n, &nd, &nu, &bad);
        if (st != TL_OK || n > MAX_TENSORS) continue;
        int64_t *cols = calloc(5 * (n ? n : 1) + (nd ? nd : 1), sizeof(int64_t));
        char *names = malloc(nu ? nu : 1);
        uint8_t *flags = malloc(n ? n : 1);
        check(cols && names && flags);
        int64_t *codes = cols, *offs = cols + n, *lens = cols + 2 * n, *crcs = cols + 3 * n, *ndims = cols + 4 * n;
        int64_t *dims = cols + 5 * n;
        uint64_t n2, nd2, nu2;
        st = tl_parse_tensors(text, a, b, itemsize_by_code, n, codes, offs, lens, crcs, ndims, dims, nd,
                              nu ? names : NULL, nu, flags, &n2, &nd2, &nu2, &bad);
        check(st == TL_OK && n2 == n && nd2 == nd && nu2 == nu);
        tl_span *sp = malloc(sizeof(tl_span) * (n ? n : 1));
        check(sp != NULL);
        uint64_t dsum = 0;
        for (uint64_t i = 0; i < n; i++) {
            check(codes[i] >= 0 && codes[i] < 256 && itemsize_by_code[codes[i]] > 0);
            check(offs[i] >= 0 && lens[i] >= 0 && crcs[i] >= -1 && crcs[i] <= 0xFFFFFFFFLL);
            dsum += (uint64_t)ndims[i];
            sp[i].offset = offs[i];
            sp[i].length = lens[i];
            sp[i].itemsize = itemsize_by_code[codes[i]];
        }
        check(dsum == nd);
        for (uint64_t i = 0; i < nd; i++) check(dims[i] >= 0);
        if (n <= 256) layout_case(n, sp, (int64_t)(size * 8));
        free(sp);
        free(flags);
        free(names);
        free(cols);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        init_table();
        ready = 1;
    }
    if (size && (data[0] == '{' || data[0] == '[' || data[0] == ' ' || data[0] == '\n')) {
        descriptor_case((const char *)data, size);
    } else if (size >= 8) {
        int64_t list_length;
        memcpy(&list_length, data, 8);
        uint64_t n = (size - 8) / sizeof(tl_span);
        if (n > 64) n = 64;
        tl_span *sp = malloc(sizeof(tl_span) * (n ? n : 1));
        check(sp != NULL);
        memcpy(sp, data + 8, n * sizeof(tl_span));
        for (uint64_t i = 0; i < n; i++) {  /* small itemsizes, mostly aligned offsets: reach overlap */
            sp[i].itemsize = (int64_t)1 << ((uint64_t)sp[i].itemsize & 3);
            if (sp[i].offset & 1) sp[i].offset = (sp[i].offset >> 1) & 0xFFF8;
            if (sp[i].length & 1) sp[i].length = (sp[i].length >> 1) & 0xFFF;
        }
        if (list_length < 0) list_length = -(list_length + 1) & 0xFFFFF;
        layout_case(n, sp, list_length);
        free(sp);
    }
    return 0;
}
