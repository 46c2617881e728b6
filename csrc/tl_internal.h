/*
 * Internals shared by the C core's files, split by concern as the CRC32C code
 * is split per CPU path (crc32c_internal.h). Not seen by cffi; tensorlist.h
 * has the public API and the conventions every file follows.
 *
 *   tl_core.c      status names, version, constants, tl_check_layout (no system calls)
 *   tl_map.c       mappings, msync, page-aligned anonymous memory (tl_alloc)
 *   tl_write.c     tl_write_items and its CRC helper threads, tl_preallocate, tl_fsync
 *   tl_read.c      parallel pread, O_DIRECT reads, page-cache residency (mincore)
 *   tl_crc_many.c  tl_crc32c_many, the threaded CRC32C driver, and tl_partition
 *   descriptor.c   the descriptor scanner; crc32c*.c the CRC32C paths and dispatcher
 *
 * Include this header first, before any system header: the feature macros
 * below only take effect there. Each platform difference sits behind one small
 * static function in the file that needs it, with the reason beside it.
 */
#ifndef TL_INTERNAL_H
#define TL_INTERNAL_H

/* Feature macros before any header: _GNU_SOURCE gives glibc's and musl's
 * sync_file_range, MAP_ANONYMOUS, posix_fallocate, O_DIRECT and madvise under
 * -std=c11; _DARWIN_C_SOURCE gives macOS's F_PREALLOCATE, F_FULLFSYNC and
 * MAP_ANON. Without them (glibc under -std=c11) those names are missing,
 * and an #if that tests for one would quietly take its fallback. */
#define _GNU_SOURCE
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE
#endif

#include "tensorlist.h"

#if defined(__GNUC__) || defined(__clang__)
#define TL_HIDDEN __attribute__((visibility("hidden")))
#else
#define TL_HIDDEN
#endif

#define IO_CHUNK ((uint64_t)1 << 30)     /* largest single read/write request */
#define PARALLEL_MIN ((uint64_t)8 << 20) /* below this, one thread does all the work */

/* How many threads a job of `bytes` gets: one below PARALLEL_MIN, else at most
 * nthreads, TL_MAX_THREADS, and one per PARALLEL_MIN / 2 bytes. */
static inline int tl_clamp_threads(int nthreads, uint64_t bytes) {
    if (nthreads < 1 || bytes < PARALLEL_MIN) return 1;
    if (nthreads > TL_MAX_THREADS) nthreads = TL_MAX_THREADS;
    uint64_t most = bytes / (PARALLEL_MIN / 2);
    if ((uint64_t)nthreads > most) nthreads = (int)(most ? most : 1);
    return nthreads;
}

/* Splits n items into at most k consecutive groups of about equal bytes, the
 * sizes lengths[i] or, with lengths NULL, items[i].length; bounds[g]..bounds[g+1]
 * is group g. Returns the number of groups. In tl_crc_many.c. */
TL_HIDDEN int tl_partition(uint64_t n, const uint64_t *lengths, const tl_write_item *items,
                           uint64_t total, int k, uint64_t *bounds);

#endif
