/*
 * tensorlist C core: memory mapping, aligned padded writes, parallel reads,
 * layout checks and CRC32C for the TensorList format (docs/FORMAT.md).
 *
 * Conventions (argon2/PyNaCl style):
 *   - every function returns an int status (TL_OK or a TL_ERR_* code) and
 *     writes its results through pointers; tl_strerror() names a status;
 *   - system errors also store errno through an `int *err_no` argument;
 *   - no Python C-API, no printing, no abort, no mutable static state (but
 *     the CPU-feature word crc32c.c caches atomically), so the functions are
 *     safe to call with the GIL released and from many threads;
 *   - every offset/length computation is checked 64-bit arithmetic.
 *
 * The declarations that cffi sees are in tensorlist_cdef.h (kept in sync by a
 * test); this header adds the constants' values for C code.
 */
#ifndef TENSORLIST_H
#define TENSORLIST_H

/* A backstop for builds that bypass csrc/build_ffi.py (which stops first with
 * the list of supported platforms): the core is POSIX (mmap, pread, pthreads). */
#if defined(_WIN32)
#error "tensorlist's C core supports Linux and macOS (POSIX), not Windows; use WSL2 on Windows"
#endif

#include <stddef.h>
#include <stdint.h>

/* Format constants, mirrored in tensorlist/format.py and tested for parity. */
#define TL_LIST_ALIGNMENT 4096      /* a list's byteOffset is a multiple of this */
#define TL_MIN_TENSOR_ALIGNMENT 8   /* every tensor starts 8-byte aligned (lamp) */
#define TL_MAX_THREADS 64

/* Status codes. */
#define TL_OK 0
#define TL_ERR_IO 1        /* a system call failed: see *err_no */
#define TL_ERR_OVERFLOW 2  /* an offset/length computation overflowed 64 bits */
#define TL_ERR_BOUNDS 3    /* a range ends past its list or file */
#define TL_ERR_ALIGN 4     /* an offset is not aligned as required */
#define TL_ERR_OVERLAP 5   /* two non-empty tensors share bytes */
#define TL_ERR_LENGTH 6    /* a byte length is not a multiple of the item size */
#define TL_ERR_ARG 7       /* an argument is invalid (NULL, zero item size, ...) */
#define TL_ERR_NOMEM 8     /* memory allocation failed */
#define TL_ERR_SHORT 9     /* the file ended before the requested range */
#define TL_ERR_JSON 10     /* the text is not strict JSON */
#define TL_ERR_FALLBACK 11 /* the fast path declines: use the exact reader */
#define TL_ERR_FORMAT 12   /* a descriptor rule is broken */

/* What tl_check_layout reports for the tensor it stopped at. */
typedef struct {
    int64_t offset;    /* byteOffset relative to the list */
    int64_t length;    /* byteLength (unpadded) */
    int64_t itemsize;  /* bytes per element of its dtype */
} tl_span;

/* One tensor to write (tl_write_items). */
typedef struct {
    const void *src;   /* caller's contiguous bytes, native order */
    uint64_t length;   /* number of bytes */
    uint64_t offset;   /* absolute file offset */
    uint32_t swap;     /* 0: copy as is; 2, 4 or 8: byte-swap elements of this size */
    uint32_t crc;      /* out: CRC32C of the bytes as stored (if TL_WRITE_CRC) */
} tl_write_item;

#define TL_WRITE_CRC 1    /* compute each item's CRC32C while writing */
#define TL_WRITE_FSYNC 2  /* fsync the file after writing */
#define TL_WRITE_SPARSE 4 /* the region reads as zeros already (a new file): long zero runs become holes */
#define TL_WRITE_WRITEBACK 8 /* start writeback while writing (the caller fsyncs later) */

const char *tl_strerror(int status);
int tl_version(void);
int tl_constants(int64_t *list_alignment, int64_t *min_tensor_alignment);

/* Checks a list's tensors: alignment (min_alignment and itemsize), length a
 * multiple of itemsize, offset + length <= list_length without overflow, and
 * no two non-empty tensors overlapping. On failure *bad is the index of the
 * first offending tensor and *other the index of the tensor it overlaps (or -1). */
int tl_check_layout(uint64_t n, const tl_span *spans, int64_t list_length,
                    int64_t min_alignment, int64_t *bad, int64_t *other);

/* Read-only private mapping of the first `length` bytes of fd. */
int tl_map_readonly(int fd, uint64_t length, void **addr, int *err_no);
/* Copy-on-write private mapping of the first `length` bytes of fd: readable
 * and writable, writes stay in this process and never reach the file. */
int tl_map_copy(int fd, uint64_t length, void **addr, int *err_no);
/* Shared writable mapping of [offset, offset + length) of fd (file already sized);
 * *data points at offset, the mapping itself starts at the page below. */
int tl_map_writable(int fd, uint64_t offset, uint64_t length, void **map_addr,
                    uint64_t *map_length, void **data, int *err_no);
int tl_unmap(void *addr, uint64_t length);
int tl_msync(void *addr, uint64_t length, int *err_no);

/* Makes fd exactly `length` bytes long with disk space reserved where the
 * filesystem supports it (so filling a mapping cannot SIGBUS on ENOSPC). */
int tl_preallocate(int fd, uint64_t length, int *err_no);

/* Flushes fd's data to stable storage: F_FULLFSYNC where the system has it
 * (macOS: fsync alone leaves the data in the drive's cache), falling back to
 * fsync where the filesystem refuses it; fsync elsewhere. The one durability
 * rule: TL_WRITE_FSYNC and every fsync of the Python layer go through it. */
int tl_fsync(int fd, int *err_no);

/* Writes items (sorted by offset, non-overlapping) with zero padding so that
 * [region_start, region_end) is fully written. One thread writes, in file order;
 * with TL_WRITE_CRC, nthreads - 1 others (nthreads - 2 with TL_WRITE_WRITEBACK)
 * checksum the large items meanwhile. */
int tl_write_items(int fd, tl_write_item *items, uint64_t n, uint64_t region_start,
                   uint64_t region_end, int nthreads, int flags, int *err_no);

/* Reads [offset, offset + length) of fd into dst with nthreads parallel preads. */
int tl_pread_full(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads,
                  int *err_no);
/* The same through an O_DIRECT descriptor of fd's file (Linux), with 8
 * requests of up to 64 MiB in flight (nthreads, if more): offset, length and
 * dst multiples of TL_DIRECT_ALIGN; TL_ERR_FALLBACK where direct reads are
 * not available. */
#define TL_DIRECT_ALIGN 4096
int tl_pread_direct(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads, int *err_no);
/* How many pages of [offset, offset + length) of fd are in the page cache (mincore). */
int tl_resident(int fd, uint64_t offset, uint64_t length, uint64_t *resident, uint64_t *pages,
                int *err_no);

/* Page-aligned anonymous memory, freed with tl_free; huge: advise 2 MiB pages. */
int tl_alloc(uint64_t length, int huge, void **out, int *err_no);
int tl_free(void *addr, uint64_t length);

/* CRC32C (Castagnoli), hardware-accelerated where the CPU allows (csrc/crc32c*.c:
 * one file per CPU path, a runtime check picks one). */
uint32_t tl_crc32c(uint32_t crc, const void *data, uint64_t length);

/* The CRC32C implementations, for running each one (tests, benchmarks). */
#define TL_CRC_AUTO 0            /* the dispatcher's choice: what tl_crc32c runs */
#define TL_CRC_PORTABLE 1        /* slicing-by-16 tables: any CPU, either byte order */
#define TL_CRC_SSE42 2           /* x86-64 SSE4.2 crc32, one stream */
#define TL_CRC_SSE42_3WAY 3      /* x86-64 SSE4.2 crc32, three streams joined with PCLMULQDQ */
#define TL_CRC_ARM64 4           /* ARMv8 CRC32 extension, one stream */
#define TL_CRC_ARM64_3WAY 5      /* ARMv8 CRC32, three streams joined with PMULL */
#define TL_CRC_ARM64_3WAY_SOFT 6 /* ARMv8 CRC32, three streams joined by a software multiply */
#define TL_CRC_VPCLMUL 7         /* x86-64 AVX2 VPCLMULQDQ, 256 bytes folded a step */
#define TL_CRC_IMPLS 8           /* codes are 0 .. TL_CRC_IMPLS - 1 */

/* CRC32C continuing `crc` through implementation `impl`; TL_ERR_ARG when this
 * build or CPU lacks it (or data is NULL with length > 0). */
int tl_crc32c_impl(int impl, uint32_t crc, const void *data, uint64_t length, uint32_t *out);
/* *available: bit i set when implementation i runs here; *chosen: the one
 * tl_crc32c runs for a buffer of `length` bytes. */
int tl_crc32c_impls(uint64_t length, uint32_t *available, int *chosen);
/* CRC32C of n buffers, in parallel. */
int tl_crc32c_many(uint64_t n, const void *const *data, const uint64_t *lengths,
                   uint32_t *out, int nthreads);

/* Strict JSON check of a whole document (one value, no duplicate keys, no
 * NaN/Infinity, finite numbers); reports the byte spans [start, end) of the
 * `tensors` arrays of TensorList objects (pairs in `spans`). TL_ERR_JSON: the
 * text is not strict JSON; TL_ERR_FALLBACK: use the exact (slow) reader. */
int tl_json_scan(const char *text, uint64_t length, uint64_t *spans, uint64_t max_spans,
                 uint64_t *n_spans, uint64_t *error_pos);

/* Reads one `tensors` array (a span from tl_json_scan) into columns. With
 * codes == NULL it only counts (*n_tensors, *n_dims, *names_used). Names are
 * copied NUL-separated into `names`; name_flags: 1 named, 2 has escapes.
 * crcs[i] is -1 when absent. TL_ERR_FORMAT: tensor *bad breaks a rule. */
int tl_parse_tensors(const char *text, uint64_t start, uint64_t end, const int64_t *itemsize_by_code,
                     uint64_t capacity, int64_t *codes, int64_t *offsets, int64_t *lengths, int64_t *crcs,
                     int64_t *ndims, int64_t *dims, uint64_t dims_capacity, char *names,
                     uint64_t names_capacity, uint8_t *name_flags, uint64_t *n_tensors, uint64_t *n_dims,
                     uint64_t *names_used, int64_t *bad);

#endif
