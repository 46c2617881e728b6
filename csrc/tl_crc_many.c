/*
 * tensorlist C core: tl_crc32c_many, the threaded CRC32C driver (n buffers on
 * up to nthreads threads: what a read checks its tensors with), and
 * tl_partition, the split into groups of about equal bytes that tl_write_items'
 * CRC helper threads use too. The CRC32C paths and their dispatch are
 * csrc/crc32c*.c. See tensorlist.h for the conventions.
 */
#include "tl_internal.h"

#include <pthread.h>

typedef struct {
    const void *const *data;
    const uint64_t *lengths;
    uint32_t *out;
    uint64_t begin, end;
} crc_job;

static void *crc_worker(void *arg) {
    crc_job *j = arg;
    for (uint64_t i = j->begin; i < j->end; i++)
        j->out[i] = tl_crc32c(0, j->data[i], j->lengths[i]);
    return NULL;
}

/* Splits n items into at most k consecutive groups of about equal bytes;
 * bounds[g]..bounds[g+1] is group g. Returns the number of groups. */
int tl_partition(uint64_t n, const uint64_t *lengths, const tl_write_item *items,
                 uint64_t total, int k, uint64_t *bounds) {
    int g = 0;
    uint64_t acc = 0;
    bounds[0] = 0;
    for (uint64_t i = 0; i < n && g < k - 1; i++) {
        acc += lengths ? lengths[i] : items[i].length;
        if (acc >= total / (uint64_t)k * (uint64_t)(g + 1)) bounds[++g] = i + 1;
    }
    if (bounds[g] != n || g == 0) bounds[++g] = n;
    return g;
}

int tl_crc32c_many(uint64_t n, const void *const *data, const uint64_t *lengths,
                   uint32_t *out, int nthreads) {
    if (n && (!data || !lengths || !out)) return TL_ERR_ARG;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++)
        if (__builtin_add_overflow(total, lengths[i], &total)) return TL_ERR_OVERFLOW;
    int k = tl_clamp_threads(nthreads, total);
    uint64_t bounds[TL_MAX_THREADS + 1];
    int groups = tl_partition(n, lengths, NULL, total, k, bounds);
    crc_job jobs[TL_MAX_THREADS];
    pthread_t tids[TL_MAX_THREADS];
    int started[TL_MAX_THREADS];
    for (int g = 0; g < groups; g++) {
        jobs[g] = (crc_job){data, lengths, out, bounds[g], bounds[g + 1]};
        started[g] = g > 0 && pthread_create(&tids[g], NULL, crc_worker, &jobs[g]) == 0;
    }
    crc_worker(&jobs[0]);
    for (int g = 1; g < groups; g++) {
        if (started[g]) pthread_join(tids[g], NULL);
        else crc_worker(&jobs[g]);
    }
    return TL_OK;
}
