/*
 * The C core's own driver, for every CPU .ci/cross.sh runs it on (natively, and aarch64 and s390x
 * under qemu-user): writes, parallel reads, mappings, layout checks, CRC32C of what was written,
 * byte order on disk, and the conformance corpus through the descriptor scanner.
 *
 *   test_core [CORPUS_TABLE FILE...]
 *
 * CORPUS_TABLE is tests/c/corpus.txt (made by tests/c/corpus_table.py from the corpus's
 * manifest.json; tests/core/test_platforms.py checks it is current): the item size of each dataType code
 * and, for each corpus file, what tl_json_scan and tl_parse_tensors must answer. Every FILE must be
 * in the table and every file of the table among the FILEs. Prints one line per failed check and
 * "test_core: N passed, M failed"; exits 0 only when nothing failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensorlist.h"

static int passed, failed;

#define CHECK(c)                                                                         \
    do {                                                                                 \
        if (c) {                                                                         \
            passed++;                                                                    \
        } else {                                                                         \
            failed++;                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);        \
        }                                                                                \
    } while (0)

/* Bitwise CRC32C (reflected 0x82F63B78): slow, obviously right, independent of the core's paths. */
static uint32_t crc_ref(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static int host_is_big(void) {
    const uint16_t one = 1;
    unsigned char b[2];
    memcpy(b, &one, 2);
    return b[0] == 0;
}

static int temp_file(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tl-test-core-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd >= 0) unlink(path);
    return fd;
}

/* x as `size` little-endian bytes, by arithmetic: the same on every host. */
static void put_le(unsigned char *dst, uint64_t x, unsigned size) {
    for (unsigned i = 0; i < size; i++) dst[i] = (unsigned char)(x >> (8 * i));
}

static uint64_t get_le(const unsigned char *src, unsigned size) {
    uint64_t x = 0;
    for (unsigned i = 0; i < size; i++) x |= (uint64_t)src[i] << (8 * i);
    return x;
}

/* Element-wise byte reversal: what the core's swap must produce. */
static void reverse_each(unsigned char *dst, const unsigned char *src, size_t n, unsigned size) {
    for (size_t i = 0; i < n; i += size)
        for (unsigned k = 0; k < size; k++) dst[i + k] = src[i + size - 1 - k];
}

/* ------------------------------------------------------------------ writes, reads, CRC */

enum { N_ITEMS = 6 };

static void test_write_read(int nthreads, int flags, uint64_t big) {
    int fd = temp_file();
    CHECK(fd >= 0);
    if (fd < 0) return;
    /* small staged, swapped (2, 4, 8), and large direct items, with gaps and padding between */
    uint64_t lens[N_ITEMS] = {1000, 77, 4096, 1200, 800, big};
    uint32_t swaps[N_ITEMS] = {0, 0, 4, 2, 8, 0};
    unsigned char *src[N_ITEMS];
    tl_write_item items[N_ITEMS];
    uint64_t off = 0;
    for (int i = 0; i < N_ITEMS; i++) {
        src[i] = malloc(lens[i]);
        CHECK(src[i] != NULL);
        if (!src[i]) return;
        for (uint64_t k = 0; k < lens[i]; k++) src[i][k] = (unsigned char)(k * (2 * (uint64_t)i + 3) + (k >> 8) + i);
        off = (off + 63) / 64 * 64;
        items[i] = (tl_write_item){src[i], lens[i], off, swaps[i], 0};
        off += lens[i] + 24;
    }
    uint64_t end = (off + 4095) / 4096 * 4096;
    /* stale bytes in the file: the write must zero every gap, not leave them */
    unsigned char junk[4096];
    memset(junk, 0xAB, sizeof junk);
    int stale = 1;
    for (uint64_t p = 0; p < end; p += sizeof junk) stale &= pwrite(fd, junk, sizeof junk, (off_t)p) == (ssize_t)sizeof junk;
    CHECK(stale);
    int err = -1;
    CHECK(tl_write_items(fd, items, N_ITEMS, 0, end, nthreads, flags, &err) == TL_OK && err == 0);

    void *back = NULL;
    CHECK(tl_alloc(end, 0, &back, &err) == TL_OK);
    if (!back) return;
    CHECK(tl_pread_full(fd, back, end, 0, nthreads, &err) == TL_OK);
    unsigned char *b = back;
    uint64_t pos = 0;
    int gaps_zero = 1;
    for (int i = 0; i < N_ITEMS; i++) {
        for (; pos < items[i].offset; pos++) gaps_zero &= b[pos] == 0;
        unsigned char *want = malloc(lens[i]);
        if (!want) return;
        if (swaps[i]) reverse_each(want, src[i], lens[i], swaps[i]);
        else memcpy(want, src[i], lens[i]);
        CHECK(memcmp(b + items[i].offset, want, lens[i]) == 0);
        if (flags & TL_WRITE_CRC) {
            CHECK(items[i].crc == crc_ref(want, lens[i]));  /* the CRC of the bytes as stored */
            CHECK(items[i].crc == tl_crc32c(0, want, lens[i]));
        }
        free(want);
        pos = items[i].offset + lens[i];
    }
    for (; pos < end; pos++) gaps_zero &= b[pos] == 0;
    CHECK(gaps_zero);

    /* crc32c_many over the stored tensors, and one read of each at its offset */
    const void *bufs[N_ITEMS];
    uint32_t many[N_ITEMS];
    for (int i = 0; i < N_ITEMS; i++) bufs[i] = b + items[i].offset;
    CHECK(tl_crc32c_many(N_ITEMS, bufs, lens, many, nthreads) == TL_OK);
    for (int i = 0; i < N_ITEMS; i++) CHECK(many[i] == crc_ref(bufs[i], lens[i]));
    unsigned char *one = malloc(lens[N_ITEMS - 1]);
    if (one) {
        CHECK(tl_pread_full(fd, one, lens[N_ITEMS - 1], items[N_ITEMS - 1].offset, nthreads, &err) == TL_OK);
        CHECK(memcmp(one, src[N_ITEMS - 1], lens[N_ITEMS - 1]) == 0);
        CHECK(tl_pread_full(fd, one, 100, end - 50, nthreads, &err) == TL_ERR_SHORT);
        free(one);
    }
    /* the same bytes read around the page cache into 2 MiB pages (several pieces a thread when big) */
    void *direct = NULL;
    CHECK(tl_alloc(end, 1, &direct, &err) == TL_OK);
    if (direct) {
        int rc = tl_pread_direct(fd, direct, end, 0, nthreads, &err);
        CHECK(rc == TL_OK || rc == TL_ERR_FALLBACK); /* FALLBACK: the filesystem refuses O_DIRECT */
        if (rc == TL_OK) {
            CHECK(memcmp(direct, back, end) == 0);
            CHECK(tl_pread_direct(fd, direct, end, 4096, nthreads, &err) == TL_ERR_SHORT); /* past the end */
        }
        CHECK(tl_pread_direct(fd, (unsigned char *)direct + 64, 4096, 0, nthreads, &err) == TL_ERR_ALIGN);
        CHECK(tl_free(direct, end) == TL_OK);
    }
    CHECK(tl_free(back, end) == TL_OK);
    for (int i = 0; i < N_ITEMS; i++) free(src[i]);
    close(fd);
}

static void test_write_refusals(void) {
    int fd = temp_file();
    if (fd < 0) return;
    unsigned char a[64] = {0};
    int err;
    tl_write_item overlap[2] = {{a, 64, 0, 0, 0}, {a, 64, 32, 0, 0}};
    CHECK(tl_write_items(fd, overlap, 2, 0, 4096, 1, 0, &err) == TL_ERR_OVERLAP);
    tl_write_item odd_swap = {a, 64, 0, 3, 0};
    CHECK(tl_write_items(fd, &odd_swap, 1, 0, 4096, 1, 0, &err) == TL_ERR_ARG);
    tl_write_item part = {a, 63, 0, 4, 0};
    CHECK(tl_write_items(fd, &part, 1, 0, 4096, 1, 0, &err) == TL_ERR_LENGTH);
    tl_write_item past = {a, 64, 4090, 0, 0};
    CHECK(tl_write_items(fd, &past, 1, 0, 4096, 1, 0, &err) == TL_ERR_BOUNDS);
    CHECK(lseek(fd, 0, SEEK_END) == 0);  /* refused before writing anything */
    close(fd);
}

/* ------------------------------------------------------------------ mapping, durability */

static void test_map_and_sync(void) {
    int fd = temp_file();
    if (fd < 0) return;
    int err = -1;
    CHECK(tl_preallocate(fd, 20000, &err) == TL_OK && err == 0);
    CHECK(lseek(fd, 0, SEEK_END) == 20000);
    void *maddr = NULL, *mdata = NULL;
    uint64_t mlen = 0;
    CHECK(tl_map_writable(fd, 12345, 100, &maddr, &mlen, &mdata, &err) == TL_OK);
    if (mdata) {
        for (int i = 0; i < 100; i++) ((unsigned char *)mdata)[i] = (unsigned char)(i + 1);
        CHECK(tl_msync(maddr, mlen, &err) == TL_OK);
        CHECK(tl_unmap(maddr, mlen) == TL_OK);
    }
    CHECK(tl_fsync(fd, &err) == TL_OK && err == 0);
    void *ro = NULL;
    CHECK(tl_map_readonly(fd, 20000, &ro, &err) == TL_OK);
    if (ro) {
        const unsigned char *r = ro;
        int ok = r[12344] == 0 && r[12445] == 0;
        for (int i = 0; i < 100; i++) ok &= r[12345 + i] == (unsigned char)(i + 1);
        CHECK(ok);
        CHECK(tl_unmap(ro, 20000) == TL_OK);
    }
    void *cow = NULL;
    CHECK(tl_map_copy(fd, 20000, &cow, &err) == TL_OK);  /* copy-on-write: writes never reach the file */
    if (cow) {
        unsigned char *c = cow;
        int ok = 1;
        for (int i = 0; i < 100; i++) ok &= c[12345 + i] == (unsigned char)(i + 1);
        CHECK(ok);
        for (int i = 0; i < 100; i++) c[12345 + i] = 0xEE;
        CHECK(c[12345] == 0xEE && c[12444] == 0xEE);
        unsigned char back[100];
        CHECK(pread(fd, back, sizeof back, 12345) == (ssize_t)sizeof back);
        ok = 1;
        for (int i = 0; i < 100; i++) ok &= back[i] == (unsigned char)(i + 1);
        CHECK(ok);  /* the file still holds what was written before */
        void *again = NULL;  /* and a fresh mapping sees the file, not this process's private pages */
        CHECK(tl_map_copy(fd, 20000, &again, &err) == TL_OK);
        if (again) {
            CHECK(((unsigned char *)again)[12345] == 1);
            CHECK(tl_unmap(again, 20000) == TL_OK);
        }
        CHECK(tl_unmap(cow, 20000) == TL_OK);
    }
    CHECK(tl_map_copy(fd, 0, &cow, &err) == TL_ERR_ARG);
    CHECK(tl_preallocate(fd, 5000, &err) == TL_OK && lseek(fd, 0, SEEK_END) == 5000);  /* exactly that long */
    close(fd);
    CHECK(tl_fsync(fd, &err) == TL_ERR_IO && err == EBADF);  /* a closed descriptor: errno reported */
    CHECK(tl_map_readonly(fd, 10, &ro, &err) == TL_ERR_IO && err == EBADF);
    CHECK(tl_map_copy(fd, 10, &ro, &err) == TL_ERR_IO && err == EBADF);
}

/* ------------------------------------------------------------------ layout */

static void test_layout(void) {
    int64_t bad, other;
    tl_span ok[3] = {{0, 16, 4}, {16, 8, 8}, {64, 0, 2}};
    CHECK(tl_check_layout(3, ok, 64, 8, &bad, &other) == TL_OK && bad == -1);
    tl_span unaligned[1] = {{4, 8, 4}};
    CHECK(tl_check_layout(1, unaligned, 64, 8, &bad, &other) == TL_ERR_ALIGN && bad == 0);
    tl_span itemsize[1] = {{8, 16, 16}};
    CHECK(tl_check_layout(1, itemsize, 64, 8, &bad, &other) == TL_ERR_ALIGN);
    tl_span length[2] = {{0, 8, 8}, {8, 6, 4}};
    CHECK(tl_check_layout(2, length, 64, 8, &bad, &other) == TL_ERR_LENGTH && bad == 1);
    tl_span past[1] = {{56, 16, 8}};
    CHECK(tl_check_layout(1, past, 64, 8, &bad, &other) == TL_ERR_BOUNDS);
    tl_span overflow[1] = {{INT64_MAX - 7, 16, 8}};
    CHECK(tl_check_layout(1, overflow, INT64_MAX, 8, &bad, &other) == TL_ERR_OVERFLOW);
    tl_span sorted[2] = {{0, 16, 8}, {8, 8, 8}};
    CHECK(tl_check_layout(2, sorted, 64, 8, &bad, &other) == TL_ERR_OVERLAP && bad == 1 && other == 0);
    tl_span unsorted[3] = {{32, 8, 8}, {0, 8, 8}, {24, 16, 8}};
    CHECK(tl_check_layout(3, unsorted, 64, 8, &bad, &other) == TL_ERR_OVERLAP && bad == 2 && other == 0);
    tl_span zero_itemsize[1] = {{0, 8, 0}};
    CHECK(tl_check_layout(1, zero_itemsize, 64, 8, &bad, &other) == TL_ERR_ARG);
}

/* ------------------------------------------------------------------ byte order on disk */

/* Arrays of `count` elements of `size` bytes, in the host's order or the other one, written with the
 * swap the Python layer asks for (swap unless the array's order is little-endian): the file must
 * hold exactly the little-endian bytes, and read back (swapped again on a big-endian host) the
 * values must come back. On s390x this is the native big-endian path; on little-endian hosts the
 * foreign (big-endian) arrays take the swap. */
static void test_byte_order(void) {
    enum { COUNT = 37 };
    const int big = host_is_big();
    const unsigned sizes[3] = {2, 4, 8};
    for (int foreign = 0; foreign < 2; foreign++) {
        int array_big = foreign ? !big : big;
        for (int s = 0; s < 3; s++) {
            unsigned size = sizes[s];
            uint64_t values[COUNT];
            unsigned char arr[COUNT * 8], le[COUNT * 8];
            for (int i = 0; i < COUNT; i++) {
                values[i] = (0x0102030405060708ull * (uint64_t)(i + 1)) >> (64 - 8 * size);
                put_le(le + i * size, values[i], size);
                /* the array as a host of that order holds it in memory */
                if (array_big) reverse_each(arr + i * size, le + i * size, size, size);
                else memcpy(arr + i * size, le + i * size, size);
            }
            if (!foreign) {  /* native arrays really are what the compiler stores */
                int same = 1;
                for (int i = 0; i < COUNT; i++) {
                    if (size == 2) { uint16_t v = (uint16_t)values[i]; same &= memcmp(arr + i * 2, &v, 2) == 0; }
                    if (size == 4) { uint32_t v = (uint32_t)values[i]; same &= memcmp(arr + i * 4, &v, 4) == 0; }
                    if (size == 8) { same &= memcmp(arr + i * 8, &values[i], 8) == 0; }
                }
                CHECK(same);
            }
            int fd = temp_file();
            if (fd < 0) return;
            tl_write_item it = {arr, (uint64_t)COUNT * size, 8, array_big ? size : 0, 0};
            int err;
            CHECK(tl_write_items(fd, &it, 1, 0, 4096, 1, TL_WRITE_CRC, &err) == TL_OK);
            unsigned char disk[COUNT * 8];
            CHECK(pread(fd, disk, COUNT * size, 8) == (ssize_t)(COUNT * size));
            CHECK(memcmp(disk, le, COUNT * size) == 0);                /* exact little-endian bytes */
            CHECK(it.crc == crc_ref(le, COUNT * size));
            int equal = 1;
            for (int i = 0; i < COUNT; i++) equal &= get_le(disk + i * size, size) == values[i];
            CHECK(equal);
            unsigned char native[COUNT * 8];                           /* what a reader hands a host */
            CHECK(tl_pread_full(fd, native, COUNT * size, 8, 2, &err) == TL_OK);
            unsigned char host[COUNT * 8];
            if (big) reverse_each(host, native, COUNT * size, size);
            else memcpy(host, native, COUNT * size);
            int back = 1;
            for (int i = 0; i < COUNT; i++) {
                uint64_t v = 0;
                if (size == 2) { uint16_t x; memcpy(&x, host + i * 2, 2); v = x; }
                if (size == 4) { uint32_t x; memcpy(&x, host + i * 4, 4); v = x; }
                if (size == 8) { memcpy(&v, host + i * 8, 8); }
                back &= v == values[i];
            }
            CHECK(back);
            close(fd);
        }
    }
}

/* ------------------------------------------------------------------ the conformance corpus */

typedef struct {
    char file[512];   /* "valid/x.tl" */
    char expect[16];  /* "ok" or "error" */
    int scan;         /* tl_json_scan's status */
    char spans[1024]; /* per tensors array: "N:c.c.c" parsed, "xS" refused with status S; "-" none */
    int seen;
} corpus_case;

static int64_t itemsize_by_code[256];

static char *read_all(const char *path, uint64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    *n = len;
    return buf;
}

/* What the scanner and the column reader say about one document, in the table's notation. */
static void describe(const char *text, uint64_t n, int *scan, char *out, size_t out_size) {
    enum { MAX_SPANS = 64 };
    uint64_t spans[2 * MAX_SPANS], n_spans = 0, pos = 0;
    *scan = tl_json_scan(text, n, spans, MAX_SPANS, &n_spans, &pos);
    size_t used = 0;
    out[0] = 0;
    if (n_spans == 0) snprintf(out, out_size, "-");
    for (uint64_t k = 0; k < n_spans && used < out_size; k++) {
        uint64_t nt = 0, nd = 0, nu = 0;
        int64_t bad = -1;
        int st = tl_parse_tensors(text, spans[2 * k], spans[2 * k + 1], itemsize_by_code, 0, NULL, NULL, NULL,
                                  NULL, NULL, NULL, 0, NULL, 0, NULL, &nt, &nd, &nu, &bad);
        used += (size_t)snprintf(out + used, out_size - used, "%s", k ? "," : "");
        if (st != TL_OK) {
            used += (size_t)snprintf(out + used, out_size - used, "x%d", st);
            continue;
        }
        uint64_t cap = nt ? nt : 1, dcap = nd ? nd : 1, ncap = nu ? nu : 1;
        int64_t *cols = calloc(5 * cap + dcap, sizeof(int64_t));
        char *names = malloc(ncap);
        uint8_t *flags = malloc(cap);
        if (!cols || !names || !flags) return;
        st = tl_parse_tensors(text, spans[2 * k], spans[2 * k + 1], itemsize_by_code, cap, cols, cols + cap,
                              cols + 2 * cap, cols + 3 * cap, cols + 4 * cap, cols + 5 * cap, dcap, names, ncap,
                              flags, &nt, &nd, &nu, &bad);
        if (st != TL_OK) {
            used += (size_t)snprintf(out + used, out_size - used, "fill%d", st);
        } else {
            used += (size_t)snprintf(out + used, out_size - used, "%llu:", (unsigned long long)nt);
            for (uint64_t t = 0; t < nt && used < out_size; t++)
                used += (size_t)snprintf(out + used, out_size - used, "%s%lld", t ? "." : "", (long long)cols[t]);
        }
        free(cols);
        free(names);
        free(flags);
    }
}

static void test_corpus(const char *table_path, int nfiles, char **files) {
    FILE *f = fopen(table_path, "r");
    CHECK(f != NULL);
    if (!f) return;
    corpus_case *cases = NULL;
    size_t n = 0, cap = 0;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        int code, size;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "itemsize %d %d", &code, &size) == 2) {
            if (code >= 0 && code < 256) itemsize_by_code[code] = size;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 128;
            corpus_case *nc = realloc(cases, cap * sizeof *cases);
            if (!nc) { free(cases); fclose(f); return; }
            cases = nc;
        }
        corpus_case *c = &cases[n];
        memset(c, 0, sizeof *c);
        if (sscanf(line, "case %511s %15s %d %1023s", c->file, c->expect, &c->scan, c->spans) == 4) n++;
        else { fprintf(stderr, "%s: cannot read the line: %s", table_path, line); failed++; }
    }
    fclose(f);
    CHECK(n > 0);
    for (int i = 0; i < nfiles; i++) {
        /* the table names files by their last two components: "valid/x.tl" */
        const char *p = files[i], *rel = p, *last = strrchr(p, '/');
        if (last) {
            const char *q = last;
            while (q > p && q[-1] != '/') q--;
            rel = q;
        }
        corpus_case *c = NULL;
        for (size_t k = 0; k < n; k++)
            if (strcmp(cases[k].file, rel) == 0) c = &cases[k];
        if (!c) {
            fprintf(stderr, "%s: not in %s\n", p, table_path);
            failed++;
            continue;
        }
        uint64_t len = 0;
        char *text = read_all(p, &len);
        if (!text) {
            fprintf(stderr, "%s: cannot read\n", p);
            failed++;
            continue;
        }
        int scan;
        char got[1024];
        describe(text, len, &scan, got, sizeof got);
        free(text);
        c->seen = 1;
        if (scan == c->scan && strcmp(got, c->spans) == 0) {
            passed++;
        } else {
            fprintf(stderr, "%s (%s): scan %d, tensors %s; the table says scan %d, tensors %s\n", c->file,
                    c->expect, scan, got, c->scan, c->spans);
            failed++;
        }
        if (strcmp(c->expect, "ok") == 0) CHECK(scan == TL_OK && strchr(got, 'x') == NULL);
    }
    for (size_t k = 0; k < n; k++) {
        if (!cases[k].seen) {
            fprintf(stderr, "%s: in the table, not among the files given\n", cases[k].file);
            failed++;
        }
    }
    free(cases);
}

int main(int argc, char **argv) {
    CHECK(tl_version() >= 1);
    for (int s = 0; s <= TL_ERR_FORMAT + 1; s++) CHECK(tl_strerror(s) != NULL);
    static const unsigned char check[] = "123456789";
    CHECK(tl_crc32c(0, check, 9) == 0xE3069283u && crc_ref(check, 9) == 0xE3069283u);
    /* one thread; several (helper CRC threads and parallel preads need 8 MiB and up) */
    test_write_read(1, TL_WRITE_CRC, 300000);
    test_write_read(1, TL_WRITE_CRC | TL_WRITE_SPARSE | TL_WRITE_FSYNC, 300000);
    test_write_read(4, TL_WRITE_CRC | TL_WRITE_WRITEBACK, (uint64_t)12 << 20);
    test_write_read(2, TL_WRITE_CRC, (uint64_t)40 << 20); /* two threads: a writer and a CRC helper */
    test_write_read(2, TL_WRITE_CRC | TL_WRITE_WRITEBACK, (uint64_t)40 << 20); /* the writer checksums inline */
    test_write_read(3, 0, (uint64_t)9 << 20);
    test_write_refusals();
    test_map_and_sync();
    test_layout();
    test_byte_order();
    if (argc > 1) test_corpus(argv[1], argc - 2, argv + 2);
    printf("test_core: %d passed, %d failed (%s-endian host%s)\n", passed, failed, host_is_big() ? "big" : "little",
           argc > 1 ? ", corpus" : ", no corpus table given");
    return failed != 0;
}
