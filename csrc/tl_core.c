/*
 * tensorlist C core: status names, version, format constants and the layout
 * check. Pure computation, no system calls. See tensorlist.h for the
 * conventions, tl_internal.h for how the core is split into files.
 */
#include "tl_internal.h"

#include <stdlib.h>

#define TL_CORE_VERSION 1

const char *tl_strerror(int status) {
    switch (status) {
    case TL_OK: return "success";
    case TL_ERR_IO: return "input/output error";
    case TL_ERR_OVERFLOW: return "offset or length overflows 64 bits";
    case TL_ERR_BOUNDS: return "range lies outside its list or file";
    case TL_ERR_ALIGN: return "offset is not aligned";
    case TL_ERR_OVERLAP: return "tensors overlap";
    case TL_ERR_LENGTH: return "byte length is not a multiple of the item size";
    case TL_ERR_ARG: return "invalid argument";
    case TL_ERR_NOMEM: return "out of memory";
    case TL_ERR_SHORT: return "file is shorter than the requested range";
    case TL_ERR_JSON: return "not strict JSON";
    case TL_ERR_FALLBACK: return "fast path declined";
    case TL_ERR_FORMAT: return "descriptor rule broken";
    default: return "unknown status";
    }
}

int tl_version(void) { return TL_CORE_VERSION; }

int tl_constants(int64_t *list_alignment, int64_t *min_tensor_alignment) {
    if (!list_alignment || !min_tensor_alignment) return TL_ERR_ARG;
    *list_alignment = TL_LIST_ALIGNMENT;
    *min_tensor_alignment = TL_MIN_TENSOR_ALIGNMENT;
    return TL_OK;
}

/* ------------------------------------------------------------------ layout */

typedef struct {
    int64_t offset;
    int64_t end;
    int64_t index;
} span_sort;

static int span_cmp(const void *a, const void *b) {
    const span_sort *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

int tl_check_layout(uint64_t n, const tl_span *spans, int64_t list_length,
                    int64_t min_alignment, int64_t *bad, int64_t *other) {
    if (!bad || !other || (n && !spans) || list_length < 0 || min_alignment <= 0) return TL_ERR_ARG;
    if (n > (uint64_t)INT64_MAX) return TL_ERR_ARG;
    *bad = -1;
    *other = -1;
    int sorted = 1;
    int64_t prev_off = -1;
    for (uint64_t i = 0; i < n; i++) {
        const tl_span *s = &spans[i];
        int64_t end;
        *bad = (int64_t)i;
        if (s->itemsize <= 0) return TL_ERR_ARG;
        if (s->offset < 0 || s->length < 0) return TL_ERR_BOUNDS;
        if (s->offset % min_alignment != 0 || s->offset % s->itemsize != 0) return TL_ERR_ALIGN;
        if (s->length % s->itemsize != 0) return TL_ERR_LENGTH;
        if (__builtin_add_overflow(s->offset, s->length, &end)) return TL_ERR_OVERFLOW;
        if (end > list_length) return TL_ERR_BOUNDS;
        if (s->length > 0) {
            if (s->offset < prev_off) sorted = 0;
            prev_off = s->offset;
        }
    }
    *bad = -1;
    if (sorted) {
        int64_t prev_end = 0, prev_idx = -1;
        for (uint64_t i = 0; i < n; i++) {
            if (spans[i].length == 0) continue;
            if (prev_idx >= 0 && spans[i].offset < prev_end) {
                *bad = (int64_t)i;
                *other = prev_idx;
                return TL_ERR_OVERLAP;
            }
            prev_end = spans[i].offset + spans[i].length;
            prev_idx = (int64_t)i;
        }
        return TL_OK;
    }
    size_t bytes;
    if (__builtin_mul_overflow((size_t)n, sizeof(span_sort), &bytes)) return TL_ERR_NOMEM;
    span_sort *v = malloc(bytes ? bytes : 1);
    if (!v) return TL_ERR_NOMEM;
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (spans[i].length == 0) continue;
        v[m].offset = spans[i].offset;
        v[m].end = spans[i].offset + spans[i].length;
        v[m].index = (int64_t)i;
        m++;
    }
    qsort(v, (size_t)m, sizeof(span_sort), span_cmp);
    int status = TL_OK;
    for (uint64_t j = 1; j < m; j++) {
        if (v[j].offset < v[j - 1].end) {
            /* report the later tensor in file order as the culprit */
            int64_t a = v[j].index, b = v[j - 1].index;
            *bad = a > b ? a : b;
            *other = a > b ? b : a;
            status = TL_ERR_OVERLAP;
            break;
        }
    }
    free(v);
    return status;
}
