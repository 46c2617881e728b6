/*
 * tensorlist C core: writes. tl_write_items (padded, in file order, with the
 * CRC32C of each item computed inline or by helper threads, holes for long
 * zero runs, writeback hints), tl_preallocate (disk space reserved up front)
 * and tl_fsync (the one durability rule). See tensorlist.h for the conventions.
 */
#include "tl_internal.h"
#include "crc32c_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAGE_BYTES ((size_t)4 << 20)      /* per-thread staging buffer */
#define DIRECT_MIN ((uint64_t)256 << 10)   /* larger tensors are written straight from the caller */
#define SPARSE_MIN ((uint64_t)64 << 10)    /* zero runs this long are left as holes (TL_WRITE_SPARSE) */
#define FUSED_PIECE ((uint64_t)256 << 10)  /* CRC then write this much at a time (stays in L2) */
#define WRITEBACK_BYTES ((uint64_t)16 << 20) /* TL_WRITE_WRITEBACK: start writeback this often */

/* ------------------------------------------------------ space and durability */

/* Reserves disk space for [0, length) (posix_fallocate also extends the
 * file, F_PREALLOCATE does not: tl_preallocate sizes it after). Returns 0, an errno meaning "this filesystem cannot reserve" (EOPNOTSUPP,
 * EINVAL, ENOSYS, ENOTSUP: the caller then only sizes the file), or another
 * errno. One function per platform difference, so tl_preallocate reads the
 * same everywhere: Linux and the BSDs have posix_fallocate; macOS has not,
 * and reserves with fcntl(F_PREALLOCATE), contiguous space first (faster to
 * read back), then any space. */
static int reserve_space(int fd, uint64_t length) {
#if defined(F_PREALLOCATE)
    struct stat st;
    if (fstat(fd, &st) != 0) return errno;
    if ((uint64_t)st.st_size >= length) return 0;
    /* F_PEOFPOSMODE: the range starts at the file's physical end, so only the growth is asked for */
    fstore_t store = {.fst_flags = F_ALLOCATECONTIG | F_ALLOCATEALL, .fst_posmode = F_PEOFPOSMODE,
                      .fst_offset = 0, .fst_length = (off_t)(length - (uint64_t)st.st_size)};
    if (fcntl(fd, F_PREALLOCATE, &store) == 0) return 0;
    store.fst_flags = F_ALLOCATEALL;
    if (fcntl(fd, F_PREALLOCATE, &store) == 0) return 0;
    return errno;
#else
    return posix_fallocate(fd, 0, (off_t)length);
#endif
}

int tl_preallocate(int fd, uint64_t length, int *err_no) {
    if (!err_no || length > (uint64_t)INT64_MAX) return TL_ERR_ARG;
    *err_no = 0;
    if (length > 0) {
        int rc = reserve_space(fd, length);
        if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL && rc != ENOSYS && rc != ENOTSUP) {
            *err_no = rc;
            return TL_ERR_IO;
        }
    }
    /* Sets the size: posix_fallocate already did (a no-op then), F_PREALLOCATE
     * does not, and a filesystem that cannot reserve space (FUSE, some network
     * mounts) still gets a file of the right size. */
    if (ftruncate(fd, (off_t)length) != 0) {
        *err_no = errno;
        return TL_ERR_IO;
    }
    return TL_OK;
}

/* The one durability rule (docs/SECURITY.md): on macOS fsync() hands the data
 * to the drive but does not flush the drive's own cache, so a power cut can
 * still lose it; F_FULLFSYNC asks the drive to flush. Filesystems that do not
 * support it (network mounts, some FUSE) fail it: plain fsync is then the best
 * there is. Elsewhere fsync() reaches stable storage (Linux flushes the drive
 * cache when the filesystem uses write barriers, the default). */
int tl_fsync(int fd, int *err_no) {
    if (!err_no) return TL_ERR_ARG;
    *err_no = 0;
#if defined(F_FULLFSYNC)
    if (fcntl(fd, F_FULLFSYNC) == 0) return TL_OK;
    /* any failure: fsync below says whether the descriptor itself is bad */
#endif
    while (fsync(fd) != 0) {
        if (errno == EINTR) continue;
        *err_no = errno;
        return TL_ERR_IO;
    }
    return TL_OK;
}

/* --------------------------------------------------------------- raw I/O */

static int pwrite_all(int fd, const unsigned char *buf, uint64_t len, uint64_t off, int *err_no) {
    while (len > 0) {
        size_t want = (size_t)(len < IO_CHUNK ? len : IO_CHUNK);
        ssize_t w = pwrite(fd, buf, want, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            *err_no = errno;
            return TL_ERR_IO;
        }
        if (w == 0) {
            *err_no = ENOSPC;
            return TL_ERR_IO;
        }
        buf += w;
        len -= (uint64_t)w;
        off += (uint64_t)w;
    }
    return TL_OK;
}

/* ------------------------------------------------------------------ writes */

typedef struct {
    int fd;
    tl_write_item *items;
    uint64_t begin, end;          /* item indices */
    uint64_t range_start, range_end;
    int flags;
    int status;
    int err_no;
    unsigned char *stage;
    uint64_t stage_off, stage_len, cursor;
    uint64_t wb_start;            /* start of the written range not yet handed to writeback */
    int crc_direct_elsewhere;     /* helper threads compute the CRCs of directly written items */
} write_job;

/* Asks the kernel to start writing [offset, offset + length) of fd back,
 * without waiting. Only Linux has sync_file_range; elsewhere the hint is not
 * given and the final fsync writes everything. */
static void writeback_hint(int fd, uint64_t offset, uint64_t length) {
#ifdef SYNC_FILE_RANGE_WRITE
    (void)sync_file_range(fd, (off_t)offset, (off_t)length, SYNC_FILE_RANGE_WRITE);
#else
    (void)fd;
    (void)offset;
    (void)length;
#endif
}

/* TL_WRITE_WRITEBACK: start writeback of what this thread wrote every
 * WRITEBACK_BYTES, so the disk works while later tensors are copied and the
 * final fsync only waits for the tail. Advisory: errors surface at fsync. */
static void start_writeback(write_job *j, int force) {
    if (!(j->flags & TL_WRITE_WRITEBACK) || j->cursor <= j->wb_start) return;
    if (!force && j->cursor - j->wb_start < WRITEBACK_BYTES) return;
    writeback_hint(j->fd, j->wb_start, j->cursor - j->wb_start);
    j->wb_start = j->cursor;
}

static int stage_flush(write_job *j) {
    int rc = TL_OK;
    if (j->stage_len) rc = pwrite_all(j->fd, j->stage, j->stage_len, j->stage_off, &j->err_no);
    j->stage_off = j->cursor;
    j->stage_len = 0;
    if (rc == TL_OK) start_writeback(j, 0);
    return rc;
}

static int emit_zeros(write_job *j, uint64_t k) {
    if ((j->flags & TL_WRITE_SPARSE) && k >= SPARSE_MIN) {
        int rc = stage_flush(j);
        j->cursor += k;          /* leave a hole: the new file reads as zeros there */
        j->stage_off = j->cursor;
        return rc;
    }
    while (k > 0) {
        if (j->stage_len == STAGE_BYTES) {
            int rc = stage_flush(j);
            if (rc) return rc;
        }
        uint64_t room = STAGE_BYTES - j->stage_len;
        uint64_t m = k < room ? k : room;
        memset(j->stage + j->stage_len, 0, (size_t)m);
        j->stage_len += m;
        j->cursor += m;
        k -= m;
    }
    return TL_OK;
}

static void swap_copy(unsigned char *dst, const unsigned char *src, uint64_t n, uint32_t size) {
    switch (size) {
    case 2:
        for (uint64_t i = 0; i < n; i += 2) {
            uint16_t v;
            memcpy(&v, src + i, 2);
            v = __builtin_bswap16(v);
            memcpy(dst + i, &v, 2);
        }
        break;
    case 4:
        for (uint64_t i = 0; i < n; i += 4) {
            uint32_t v;
            memcpy(&v, src + i, 4);
            v = __builtin_bswap32(v);
            memcpy(dst + i, &v, 4);
        }
        break;
    default:
        for (uint64_t i = 0; i < n; i += 8) {
            uint64_t v;
            memcpy(&v, src + i, 8);
            v = __builtin_bswap64(v);
            memcpy(dst + i, &v, 8);
        }
        break;
    }
}

static int is_direct(const tl_write_item *it) { return it->length >= DIRECT_MIN && it->swap == 0; }

static int emit_item(write_job *j, tl_write_item *it) {
    const unsigned char *src = it->src;
    uint32_t crc = ~0u;
    int want_crc = j->flags & TL_WRITE_CRC;
    if (is_direct(it)) {
        int rc = stage_flush(j);
        if (rc) return rc;
        if (j->crc_direct_elsewhere) want_crc = 0; /* a helper thread sets it->crc */
        /* With a CRC, go piece by piece: the kernel copies each piece while
         * it is still in cache from the CRC pass (one trip through memory). */
        uint64_t left = it->length, piece = want_crc ? FUSED_PIECE : IO_CHUNK;
        if (j->flags & TL_WRITE_WRITEBACK && piece > WRITEBACK_BYTES) piece = WRITEBACK_BYTES;
        while (left > 0) {
            uint64_t m = left < piece ? left : piece;
            if (want_crc) crc = tl_crc32c_update(crc, src, m);
            rc = pwrite_all(j->fd, src, m, j->cursor, &j->err_no);
            if (rc) return rc;
            j->cursor += m;
            src += m;
            left -= m;
            start_writeback(j, 0);
        }
        j->stage_off = j->cursor;
        if (j->crc_direct_elsewhere) return TL_OK;
    } else {
        uint64_t left = it->length;
        while (left > 0) {
            if (j->stage_len == STAGE_BYTES) {
                int rc = stage_flush(j);
                if (rc) return rc;
            }
            uint64_t room = STAGE_BYTES - j->stage_len;
            uint64_t m = left < room ? left : room;
            if (it->swap) m -= m % it->swap; /* whole elements only */
            if (m == 0) {                    /* room smaller than one element */
                int rc = stage_flush(j);
                if (rc) return rc;
                continue;
            }
            unsigned char *dst = j->stage + j->stage_len;
            if (it->swap) swap_copy(dst, src, m, it->swap);
            else memcpy(dst, src, (size_t)m);
            if (want_crc) crc = tl_crc32c_update(crc, dst, m);
            j->stage_len += m;
            j->cursor += m;
            src += m;
            left -= m;
        }
    }
    it->crc = ~crc;
    return TL_OK;
}

static void *write_worker(void *arg) {
    write_job *j = arg;
    j->stage = malloc(STAGE_BYTES);
    if (!j->stage) {
        j->status = TL_ERR_NOMEM;
        return NULL;
    }
    j->cursor = j->stage_off = j->wb_start = j->range_start;
    j->stage_len = 0;
    int rc = TL_OK;
    for (uint64_t i = j->begin; i < j->end && rc == TL_OK; i++) {
        tl_write_item *it = &j->items[i];
        rc = emit_zeros(j, it->offset - j->cursor);
        if (rc == TL_OK) rc = emit_item(j, it);
    }
    if (rc == TL_OK) rc = emit_zeros(j, j->range_end - j->cursor);
    if (rc == TL_OK) rc = stage_flush(j);
    if (rc == TL_OK) start_writeback(j, 1);
    free(j->stage);
    j->stage = NULL;
    j->status = rc;
    return NULL;
}

typedef struct {
    tl_write_item *items;
    uint64_t begin, end;
} crc_direct_job;

static void *crc_direct_worker(void *arg) {
    crc_direct_job *j = arg;
    for (uint64_t i = j->begin; i < j->end; i++) {
        tl_write_item *it = &j->items[i];
        if (is_direct(it)) it->crc = ~tl_crc32c_update(~0u, it->src, it->length);
    }
    return NULL;
}

/* One thread writes, in file order. The CRC32Cs of the large items are
 * computed by helper threads meanwhile: all threads but the writer, or, with
 * TL_WRITE_WRITEBACK, all but two (the kernel submits and completes the
 * writeback on the remaining core). Without helpers the writer checksums each
 * piece just before writing it (the kernel then copies it from cache).
 * Measured on the 2-core VMs (bench_io.py workload A, 1 GiB in 256 tensors;
 * 512 MiB runs alike), fastest of 7: without writeback, writer + one helper
 * 0.243 s, the writer checksumming inline 0.278-0.284 s, no CRC 0.243 s, raw
 * write() 0.243-0.245 s; with writeback, one helper 0.55-0.60 s against
 * 0.42-0.44 s inline. Two writers into one file do worse (ext4's buffered
 * writes to one inode take turns). */
int tl_write_items(int fd, tl_write_item *items, uint64_t n, uint64_t region_start,
                   uint64_t region_end, int nthreads, int flags, int *err_no) {
    if (!err_no || (n && !items) || region_end < region_start || region_end > (uint64_t)INT64_MAX)
        return TL_ERR_ARG;
    *err_no = 0;
    /* re-check what the caller promised: sorted, in the region, no overlap, whole elements */
    uint64_t pos = region_start, total = 0, direct = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t end;
        if (items[i].length && !items[i].src) return TL_ERR_ARG;
        if (items[i].swap && items[i].swap != 2 && items[i].swap != 4 && items[i].swap != 8)
            return TL_ERR_ARG;
        if (items[i].swap && items[i].length % items[i].swap) return TL_ERR_LENGTH;
        if (items[i].offset < pos) return TL_ERR_OVERLAP;
        if (__builtin_add_overflow(items[i].offset, items[i].length, &end)) return TL_ERR_OVERFLOW;
        if (end > region_end) return TL_ERR_BOUNDS;
        pos = end;
        total += items[i].length;
        if (is_direct(&items[i])) direct += items[i].length;
    }
    int helpers = 0, reserved = (flags & TL_WRITE_WRITEBACK) ? 2 : 1;
    if ((flags & TL_WRITE_CRC) && nthreads > reserved && direct >= PARALLEL_MIN)
        helpers = tl_clamp_threads(nthreads - reserved, direct);
    uint64_t bounds[TL_MAX_THREADS + 1];
    int groups = helpers ? tl_partition(n, NULL, items, total, helpers, bounds) : 0;
    crc_direct_job cjobs[TL_MAX_THREADS];
    pthread_t tids[TL_MAX_THREADS];
    int started[TL_MAX_THREADS];
    for (int g = 0; g < groups; g++) {
        cjobs[g] = (crc_direct_job){items, bounds[g], bounds[g + 1]};
        started[g] = pthread_create(&tids[g], NULL, crc_direct_worker, &cjobs[g]) == 0;
    }
    write_job job = {.fd = fd, .items = items, .begin = 0, .end = n, .flags = flags,
                     .range_start = region_start, .range_end = region_end,
                     .crc_direct_elsewhere = groups > 0};
    write_worker(&job);
    for (int g = 0; g < groups; g++) {
        if (started[g]) pthread_join(tids[g], NULL);
        else crc_direct_worker(&cjobs[g]);
    }
    if (job.status != TL_OK) {
        *err_no = job.err_no;
        return job.status;
    }
    if (flags & TL_WRITE_SPARSE) {
        /* a hole at the very end does not extend the file: size it explicitly */
        struct stat st;
        if (fstat(fd, &st) != 0) {
            *err_no = errno;
            return TL_ERR_IO;
        }
        if ((uint64_t)st.st_size < region_end && ftruncate(fd, (off_t)region_end) != 0) {
            *err_no = errno;
            return TL_ERR_IO;
        }
    }
    if (flags & TL_WRITE_FSYNC) return tl_fsync(fd, err_no);
    return TL_OK;
}
