/* What cffi sees of csrc/tensorlist.h (cffi's cdef takes no preprocessor
 * directives). tests/core/test_lowlevel.py checks that it matches tensorlist.h. */
#define TL_LIST_ALIGNMENT 4096
#define TL_MIN_TENSOR_ALIGNMENT 8
#define TL_MAX_THREADS 64
#define TL_OK 0
#define TL_ERR_IO 1
#define TL_ERR_OVERFLOW 2
#define TL_ERR_BOUNDS 3
#define TL_ERR_ALIGN 4
#define TL_ERR_OVERLAP 5
#define TL_ERR_LENGTH 6
#define TL_ERR_ARG 7
#define TL_ERR_NOMEM 8
#define TL_ERR_SHORT 9
#define TL_ERR_JSON 10
#define TL_ERR_FALLBACK 11
#define TL_ERR_FORMAT 12
#define TL_WRITE_CRC 1
#define TL_WRITE_FSYNC 2
#define TL_WRITE_SPARSE 4
#define TL_WRITE_WRITEBACK 8

typedef struct {
    int64_t offset;
    int64_t length;
    int64_t itemsize;
} tl_span;

typedef struct {
    const void *src;
    uint64_t length;
    uint64_t offset;
    uint32_t swap;
    uint32_t crc;
} tl_write_item;

const char *tl_strerror(int status);
int tl_version(void);
int tl_constants(int64_t *list_alignment, int64_t *min_tensor_alignment);
int tl_check_layout(uint64_t n, const tl_span *spans, int64_t list_length,
                    int64_t min_alignment, int64_t *bad, int64_t *other);
int tl_map_readonly(int fd, uint64_t length, void **addr, int *err_no);
int tl_map_copy(int fd, uint64_t length, void **addr, int *err_no);
int tl_map_writable(int fd, uint64_t offset, uint64_t length, void **map_addr,
                    uint64_t *map_length, void **data, int *err_no);
int tl_unmap(void *addr, uint64_t length);
int tl_msync(void *addr, uint64_t length, int *err_no);
int tl_preallocate(int fd, uint64_t length, int *err_no);
int tl_fsync(int fd, int *err_no);
int tl_write_items(int fd, tl_write_item *items, uint64_t n, uint64_t region_start,
                   uint64_t region_end, int nthreads, int flags, int *err_no);
int tl_pread_full(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads,
                  int *err_no);
#define TL_DIRECT_ALIGN 4096
int tl_pread_direct(int fd, void *dst, uint64_t length, uint64_t offset, int nthreads, int *err_no);
int tl_resident(int fd, uint64_t offset, uint64_t length, uint64_t *resident, uint64_t *pages,
                int *err_no);
int tl_alloc(uint64_t length, int huge, void **out, int *err_no);
int tl_free(void *addr, uint64_t length);
uint32_t tl_crc32c(uint32_t crc, const void *data, uint64_t length);
#define TL_CRC_AUTO 0
#define TL_CRC_PORTABLE 1
#define TL_CRC_SSE42 2
#define TL_CRC_SSE42_3WAY 3
#define TL_CRC_ARM64 4
#define TL_CRC_ARM64_3WAY 5
#define TL_CRC_ARM64_3WAY_SOFT 6
#define TL_CRC_VPCLMUL 7
#define TL_CRC_IMPLS 8
int tl_crc32c_impl(int impl, uint32_t crc, const void *data, uint64_t length, uint32_t *out);
int tl_crc32c_impls(uint64_t length, uint32_t *available, int *chosen);
int tl_crc32c_many(uint64_t n, const void *const *data, const uint64_t *lengths,
                   uint32_t *out, int nthreads);

int tl_json_scan(const char *text, uint64_t length, uint64_t *spans, uint64_t max_spans,
                 uint64_t *n_spans, uint64_t *error_pos);

int tl_parse_tensors(const char *text, uint64_t start, uint64_t end, const int64_t *itemsize_by_code,
                     uint64_t capacity, int64_t *codes, int64_t *offsets, int64_t *lengths, int64_t *crcs,
                     int64_t *ndims, int64_t *dims, uint64_t dims_capacity, char *names,
                     uint64_t names_capacity, uint8_t *name_flags, uint64_t *n_tensors, uint64_t *n_dims,
                     uint64_t *names_used, int64_t *bad);
