/*
 * tensorlist C core. See tensorlist.h for the conventions.
 */
/* Feature macros before any header: _GNU_SOURCE gives glibc's and musl's
 * sync_file_range, MAP_ANONYMOUS and posix_fallocate under -std=c11;
 * _DARWIN_C_SOURCE gives macOS's F_PREALLOCATE, F_FULLFSYNC and MAP_ANON. */
#define _GNU_SOURCE
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE
#endif
#include "tensorlist.h"
#include "crc32c_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TL_CORE_VERSION 1
#define STAGE_BYTES ((size_t)4 << 20)      /* per-thread staging buffer */
#define DIRECT_MIN ((uint64_t)256 << 10)   /* larger tensors are written straight from the caller */
#define SPARSE_MIN ((uint64_t)64 << 10)    /* zero runs this long are left as holes (TL_WRITE_SPARSE) */
#define IO_CHUNK ((uint64_t)1 << 30)       /* largest single read/write request */
#define PARALLEL_MIN ((uint64_t)8 << 20)   /* below this, one thread does all the work */
#define FUSED_PIECE ((uint64_t)256 << 10)  /* CRC then write this much at a time (stays in L2) */
#define WRITEBACK_BYTES ((uint64_t)16 << 20) /* TL_WRITE_WRITEBACK: start writeback this often */

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

/* ----------------------------------------------------------------- mapping */

int tl_map_readonly(int fd, uint64_t length, void **addr, int *err_no) {
    if (!addr || !err_no || length == 0 || length > (uint64_t)SIZE_MAX) return TL_ERR_ARG;
    *err_no = 0;
    void *p = mmap(NULL, (size_t)length, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        *err_no = errno;
        return TL_ERR_IO;
    }
    *addr = p;
    return TL_OK;
}

int tl_map_copy(int fd, uint64_t length, void **addr, int *err_no) {
    if (!addr || !err_no || length == 0 || length > (uint64_t)SIZE_MAX) return TL_ERR_ARG;
    *err_no = 0;
    /* Copy-on-write: writable pages that stay private to this process, so the
     * file never changes (a read-only fd is enough). The kernel reserves the
     * commit charge for the whole length up front: under strict overcommit a
     * mapping larger than what may be committed fails here (ENOMEM), not at
     * the first write. */
    void *p = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        *err_no = errno;
        return TL_ERR_IO;
    }
    *addr = p;
    return TL_OK;
}

int tl_map_writable(int fd, uint64_t offset, uint64_t length, void **map_addr,
                    uint64_t *map_length, void **data, int *err_no) {
    if (!map_addr || !map_length || !data || !err_no || length == 0) return TL_ERR_ARG;
    *err_no = 0;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    uint64_t start = offset - offset % (uint64_t)page, span, end;
    if (__builtin_add_overflow(offset, length, &end) || end > (uint64_t)INT64_MAX) return TL_ERR_OVERFLOW;
    span = end - start;
    if (span > (uint64_t)SIZE_MAX) return TL_ERR_ARG;
    void *p = mmap(NULL, (size_t)span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (p == MAP_FAILED) {
        *err_no = errno;
        return TL_ERR_IO;
    }
    *map_addr = p;
    *map_length = span;
    *data = (unsigned char *)p + (offset - start);
    return TL_OK;
}

int tl_unmap(void *addr, uint64_t length) {
    if (!addr || length == 0) return TL_ERR_ARG;
    return munmap(addr, (size_t)length) == 0 ? TL_OK : TL_ERR_IO;
}

int tl_msync(void *addr, uint64_t length, int *err_no) {
    if (!addr || !err_no || length == 0) return TL_ERR_ARG;
    *err_no = 0;
    if (msync(addr, (size_t)length, MS_SYNC) != 0) {
        *err_no = errno;
        return TL_ERR_IO;
    }
    return TL_OK;
}

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

static int pread_all(int fd, unsigned char *buf, uint64_t len, uint64_t off, int *err_no) {
    while (len > 0) {
        size_t want = (size_t)(len < IO_CHUNK ? len : IO_CHUNK);
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            *err_no = errno;
            return TL_ERR_IO;
        }
        if (r == 0) return TL_ERR_SHORT;
        buf += r;
        len -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return TL_OK;
}

static int clamp_threads(int nthreads, uint64_t bytes) {
    if (nthreads < 1 || bytes < PARALLEL_MIN) return 1;
    if (nthreads > TL_MAX_THREADS) nthreads = TL_MAX_THREADS;
    uint64_t most = bytes / (PARALLEL_MIN / 2);
    if ((uint64_t)nthreads > most) nthreads = (int)(most ? most : 1);
    return nthreads;
}

/* ------------------------------------------------------------------ CRC32C
 * The paths and their dispatch are csrc/crc32c*.c; this is the threaded driver. */

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
static int partition(uint64_t n, const uint64_t *lengths, const tl_write_item *items,
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
    int k = clamp_threads(nthreads, total);
    uint64_t bounds[TL_MAX_THREADS + 1];
    int groups = partition(n, lengths, NULL, total, k, bounds);
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

/* TL_WRITE_WRITEBACK: start writeback of what this thread wrote every
 * WRITEBACK_BYTES, so the disk works while later tensors are copied and the
 * final fsync only waits for the tail. Advisory: errors surface at fsync. */
static void start_writeback(write_job *j, int force) {
#ifdef SYNC_FILE_RANGE_WRITE
    if (!(j->flags & TL_WRITE_WRITEBACK) || j->cursor <= j->wb_start) return;
    if (!force && j->cursor - j->wb_start < WRITEBACK_BYTES) return;
    (void)sync_file_range(j->fd, (off_t)j->wb_start, (off_t)(j->cursor - j->wb_start), SYNC_FILE_RANGE_WRITE);
#else
    (void)force;
#endif
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
        helpers = clamp_threads(nthreads - reserved, direct);
    uint64_t bounds[TL_MAX_THREADS + 1];
    int groups = helpers ? partition(n, NULL, items, total, helpers, bounds) : 0;
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

/* ------------------------------------------------------------------- reads */

typedef struct {
    int fd;
    unsigned char *dst;
    uint64_t length, offset;
    int status, err_no;
} read_job;

static void *read_worker(void *arg) {
    read_job *j = arg;
    j->status = pread_all(j->fd, j->dst, j->length, j->offset, &j->err_no);
    return NULL;
}

int tl_pread_full(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads,
                  int *err_no) {
    uint64_t end;
    if (!err_no || (length && !dst)) return TL_ERR_ARG;
    if (__builtin_add_overflow(offset, length, &end) || end > (uint64_t)INT64_MAX)
        return TL_ERR_OVERFLOW;
    *err_no = 0;
    int k = clamp_threads(nthreads, length);
    read_job jobs[TL_MAX_THREADS];
    pthread_t tids[TL_MAX_THREADS];
    int started[TL_MAX_THREADS];
    /* contiguous parts rounded to 1 MiB so each thread streams sequentially */
    uint64_t part = (length / (uint64_t)k + ((uint64_t)1 << 20) - 1) & ~(((uint64_t)1 << 20) - 1);
    int groups = 0;
    for (uint64_t pos = 0; pos < length && groups < k; groups++) {
        uint64_t m = (groups == k - 1 || length - pos < part) ? length - pos : part;
        jobs[groups] = (read_job){fd, (unsigned char *)dst + pos, m, offset + pos, TL_OK, 0};
        pos += m;
    }
    for (int g = 1; g < groups; g++)
        started[g] = pthread_create(&tids[g], NULL, read_worker, &jobs[g]) == 0;
    if (groups > 0) read_worker(&jobs[0]);
    for (int g = 1; g < groups; g++) {
        if (started[g]) pthread_join(tids[g], NULL);
        else read_worker(&jobs[g]);
    }
    for (int g = 0; g < groups; g++) {
        if (jobs[g].status != TL_OK) {
            *err_no = jobs[g].err_no;
            return jobs[g].status;
        }
    }
    return TL_OK;
}

/* Pages of [offset, offset + length) of fd in the page cache (mincore over a
 * temporary read-only mapping, 64 MiB at a time). */
int tl_resident(int fd, uint64_t offset, uint64_t length, uint64_t *resident, uint64_t *pages,
                int *err_no) {
    uint64_t end;
    if (!resident || !pages || !err_no) return TL_ERR_ARG;
    if (__builtin_add_overflow(offset, length, &end) || end > (uint64_t)INT64_MAX) return TL_ERR_OVERFLOW;
    *resident = *pages = 0;
    *err_no = 0;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), step = (uint64_t)64 << 20;
    unsigned char *vec = malloc((size_t)(step / page));
    if (!vec) return TL_ERR_NOMEM;
    int rc = TL_OK;
    for (uint64_t pos = offset - offset % page; pos < end && rc == TL_OK; pos += step) {
        uint64_t m = end - pos < step ? end - pos : step;
        void *addr = mmap(NULL, (size_t)m, PROT_READ, MAP_SHARED, fd, (off_t)pos);
        if (addr == MAP_FAILED) {
            *err_no = errno;
            rc = TL_ERR_IO;
            break;
        }
#if defined(__linux__)
        int bad = mincore(addr, (size_t)m, vec);
#else
        int bad = mincore(addr, (size_t)m, (char *)vec);
#endif
        if (bad) {
            *err_no = errno;
            rc = TL_ERR_IO;
        } else {
            uint64_t k = (m + page - 1) / page;
            for (uint64_t i = 0; i < k; i++) *resident += vec[i] & 1u;
            *pages += k;
        }
        munmap(addr, (size_t)m);
    }
    free(vec);
    return rc;
}

/* Direct reads keep DIRECT_DEPTH requests in flight, whatever the core count
 * (the threads wait on the disk, not the CPU), taking pieces in file order
 * from a shared cursor: about two pieces a thread, 1 to 64 MiB each. Measured
 * on the 2-core VMs, 1 GiB into fresh memory with 2 MiB pages, paired with the
 * same minute's reads: 8 threads of 64 MiB pieces 0.78x the time of 2 threads
 * reading 512 MiB each (16 threads: 0.82x). */
#define DIRECT_DEPTH 8
#define DIRECT_PIECE_MIN ((uint64_t)1 << 20)
#define DIRECT_PIECE_MAX ((uint64_t)64 << 20)

#if defined(__linux__) && defined(O_DIRECT)
typedef struct {
    int fd;
    unsigned char *dst;
    uint64_t length, offset, piece;
    uint64_t next;       /* the next piece's start, relative to offset (atomic) */
    int status, err_no;  /* the first failure (atomic: 0 until then) */
} direct_job;

static void *direct_worker(void *arg) {
    direct_job *j = arg;
    for (;;) {
        if (__atomic_load_n(&j->status, __ATOMIC_RELAXED)) return NULL;
        uint64_t pos = __atomic_fetch_add(&j->next, j->piece, __ATOMIC_RELAXED);
        if (pos >= j->length) return NULL;
        uint64_t m = j->length - pos < j->piece ? j->length - pos : j->piece;
        int err = 0, rc = pread_all(j->fd, j->dst + pos, m, j->offset + pos, &err);
        if (rc) {
            int none = 0;
            if (__atomic_compare_exchange_n(&j->status, &none, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                j->err_no = err;
            return NULL;
        }
    }
}
#endif

/* Reads through a second, O_DIRECT descriptor of the same file: the disk's
 * DMA lands in dst and the page cache is neither filled nor copied from.
 * offset, length and dst must be multiples of TL_DIRECT_ALIGN.
 * TL_ERR_FALLBACK: no O_DIRECT here (not Linux, a filesystem without it):
 * read the ordinary way. */
int tl_pread_direct(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads, int *err_no) {
    if (!err_no || (length && !dst)) return TL_ERR_ARG;
    *err_no = 0;
    if (offset % TL_DIRECT_ALIGN || length % TL_DIRECT_ALIGN || (uintptr_t)dst % TL_DIRECT_ALIGN)
        return TL_ERR_ALIGN;
    uint64_t end;
    if (__builtin_add_overflow(offset, length, &end) || end > (uint64_t)INT64_MAX) return TL_ERR_OVERFLOW;
#if defined(__linux__) && defined(O_DIRECT)
    char name[64];
    struct stat a, b;
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    int dfd = open(name, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (dfd < 0) return TL_ERR_FALLBACK;
    /* the same file, not whatever the name now points to */
    if (fstat(fd, &a) != 0 || fstat(dfd, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(dfd);
        return TL_ERR_FALLBACK;
    }
    int k = nthreads > DIRECT_DEPTH ? nthreads : DIRECT_DEPTH;
    uint64_t piece = length / (2 * (uint64_t)k);
    piece = (piece + DIRECT_PIECE_MIN - 1) / DIRECT_PIECE_MIN * DIRECT_PIECE_MIN;
    if (piece < DIRECT_PIECE_MIN) piece = DIRECT_PIECE_MIN;
    if (piece > DIRECT_PIECE_MAX) piece = DIRECT_PIECE_MAX;
    direct_job job = {dfd, dst, length, offset, piece, 0, TL_OK, 0};
    uint64_t pieces = (length + piece - 1) / piece;
    if (k > TL_MAX_THREADS) k = TL_MAX_THREADS;
    if ((uint64_t)k > pieces) k = (int)(pieces ? pieces : 1);
    pthread_t tids[TL_MAX_THREADS];
    int started[TL_MAX_THREADS];
    for (int g = 1; g < k; g++) started[g] = pthread_create(&tids[g], NULL, direct_worker, &job) == 0;
    direct_worker(&job); /* the caller takes pieces too; it also finishes a thread's share if none started */
    for (int g = 1; g < k; g++)
        if (started[g]) pthread_join(tids[g], NULL);
    close(dfd);
    int rc = job.status;
    *err_no = job.err_no;
    if (rc == TL_ERR_IO && *err_no == EINVAL) return TL_ERR_FALLBACK; /* the filesystem refuses direct reads */
    return rc;
#else
    (void)fd;
    (void)nthreads;
    return TL_ERR_FALLBACK;
#endif
}

/* ------------------------------------------------------------------ memory */

int tl_alloc(uint64_t length, int huge, void **out, int *err_no) {
    if (!out || !err_no || length == 0 || length > (uint64_t)SIZE_MAX) return TL_ERR_ARG;
    *err_no = 0;
    void *p = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        *err_no = errno;
        return TL_ERR_NOMEM;
    }
    /* 2 MiB pages only where asked (direct reads): on the VMs we measure on,
     * an O_DIRECT read of 1 GiB into them took 0.8x the time of 4 KiB pages
     * (paired rounds), while a read through the page cache into them took
     * about 2x (median 1.38 s vs 0.65 s cold; 1.6 s vs 0.95 s in a new
     * process): the cache's own allocations then compete for the free 2 MiB
     * blocks. Advisory: where it fails, ordinary pages. */
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(p, (size_t)length, MADV_HUGEPAGE);
#else
    (void)huge;
#endif
    *out = p;
    return TL_OK;
}

int tl_free(void *addr, uint64_t length) { return tl_unmap(addr, length); }
