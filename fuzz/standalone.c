/*
 * A main() for the fuzz target and a driver of the rest of the C API, for valgrind (memcheck)
 * and for builds without libFuzzer:
 *
 *   ./standalone FILE...     runs LLVMFuzzerTestOneInput on each file's exact bytes, then
 *                            writes, preads, maps, CRCs and frees through the public C API.
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensorlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fails;
#define CHECK(c)                                                   \
    do {                                                           \
        if (!(c)) {                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            fails++;                                               \
        }                                                          \
    } while (0)

static void api_roundtrip(void) {
    char path[] = "/tmp/tl-driver-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    enum { N = 3 };
    static uint8_t a[1000], b[77], c[5000];
    for (size_t i = 0; i < sizeof a; i++) a[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(3 * i);
    for (size_t i = 0; i < sizeof c; i++) c[i] = (uint8_t)(7 * i + 1);
    tl_write_item items[N] = {{a, sizeof a, 0, 0, 0}, {b, sizeof b, 1024, 0, 0}, {c, sizeof c / 4 * 4, 1152, 4, 0}};
    int err = 0;
    CHECK(tl_write_items(fd, items, N, 0, 8192, 2, TL_WRITE_CRC | TL_WRITE_SPARSE, &err) == TL_OK);
    CHECK(items[0].crc == tl_crc32c(0, a, sizeof a));
    const void *bufs[N] = {a, b, c};
    uint64_t lens[N] = {sizeof a, sizeof b, sizeof c};
    uint32_t crcs[N];
    CHECK(tl_crc32c_many(N, bufs, lens, crcs, 3) == TL_OK);
    CHECK(crcs[0] == items[0].crc && crcs[1] == items[1].crc);
    void *dst = NULL;
    CHECK(tl_alloc(8192, 0, &dst, &err) == TL_OK);
    CHECK(tl_pread_full(fd, dst, 8192, 0, 4, &err) == TL_OK);
    CHECK(memcmp(dst, a, sizeof a) == 0 && memcmp((char *)dst + 1024, b, sizeof b) == 0);
    CHECK(tl_pread_full(fd, dst, 100, 8150, 1, &err) == TL_ERR_SHORT);  /* past the end */
    CHECK(tl_free(dst, 8192) == TL_OK);
    void *map = NULL;
    CHECK(tl_map_readonly(fd, 8192, &map, &err) == TL_OK);
    CHECK(map && memcmp(map, a, sizeof a) == 0);
    CHECK(tl_unmap(map, 8192) == TL_OK);
    void *maddr = NULL, *mdata = NULL;
    uint64_t mlen = 0;
    CHECK(tl_preallocate(fd, 20000, &err) == TL_OK);
    CHECK(tl_map_writable(fd, 12000, 100, &maddr, &mlen, &mdata, &err) == TL_OK);
    memset(mdata, 9, 100);
    CHECK(tl_msync(maddr, mlen, &err) == TL_OK);
    CHECK(tl_unmap(maddr, mlen) == TL_OK);
    CHECK(tl_check_layout(0, NULL, 0, 8, &(int64_t){0}, &(int64_t){0}) == TL_OK);
    for (int s = 0; s <= TL_ERR_FORMAT; s++) CHECK(tl_strerror(s) != NULL);
    close(fd);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) continue;  /* a directory opens but has no size: skipped below */
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        if (n < 0 || n > (1L << 24)) {
            fclose(f);
            continue;
        }
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) LLVMFuzzerTestOneInput(buf, (size_t)n);
        free(buf);
        fclose(f);
    }
    api_roundtrip();
    printf("standalone: %d inputs, %d failed checks\n", argc - 1, fails);
    return fails != 0;
}
