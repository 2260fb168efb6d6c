/* io.h - the one I/O layer every file reader of the library goes through.
 *
 * A mha_file is either an open file descriptor or a caller's memory buffer
 * (the fuzz targets parse bytes without touching the disk).  Reads are
 * positional, exact (short reads are retried; end of file is a format error
 * "truncated"), and counted, so tests can make the k-th read fail, come back
 * short, or hit a premature end of file (mha_test_fail_io).
 *
 * Internal to the library; the test suite and fuzz targets include it too. */
#ifndef MHA_IO_H
#define MHA_IO_H

#include "../internal.h"

#include <stddef.h>
#include <stdint.h>

typedef struct mha_file {
    int fd;                  /* -1 for a memory file                       */
    const uint8_t *mem;      /* memory file bytes (not owned)              */
    int64_t size;            /* bytes in the file                          */
    const char *name;        /* for messages (not owned)                   */
} mha_file;

/* Opens path read-only and records its size.  MHA_ERR_IO naming the path
 * (and strerror) when it cannot be opened or is not a regular file. */
mha_status mha_file_open(mha_file *f, const char *path);

/* A file view of size bytes at mem (not copied; must outlive f). */
void mha_file_open_mem(mha_file *f, const uint8_t *mem, size_t size, const char *name);

/* Reads exactly n bytes at offset off into buf.  `what` names the part being
 * read for messages ("header", "tensor 'x' data").  A read past the end is
 * MHA_ERR_FORMAT ("truncated"), a failing read MHA_ERR_IO. */
mha_status mha_file_read(mha_file *f, int64_t off, void *buf, size_t n, const char *what);

/* Maps the whole file read-only.  *map is NULL (and the status MHA_OK) when
 * mapping is not possible (empty file, pipe, injected failure): the caller
 * then falls back to mha_file_read.  Memory files "map" to their buffer. */
mha_status mha_file_map(mha_file *f, const uint8_t **map);
void mha_file_unmap(mha_file *f, const uint8_t *map);

void mha_file_close(mha_file *f);

/* ---- writing ------------------------------------------------------------- */

/* Writes n bytes (or fails with MHA_ERR_IO naming the path) to an open FILE*
 * opened by mha_file_create; mha_file_finish closes it and reports errors. */
typedef struct mha_wfile {
    void *fp;                /* FILE *                                       */
    const char *name;
    int failed;
} mha_wfile;
mha_status mha_wfile_create(mha_wfile *w, const char *path);
mha_status mha_wfile_write(mha_wfile *w, const void *buf, size_t n);
/* Closes; removes the partial file when anything failed or keep == 0. */
mha_status mha_wfile_finish(mha_wfile *w, int keep);

/* ---- test hook ----------------------------------------------------------- */

typedef enum mha_io_fault {
    MHA_IO_FAULT_FAIL = 0,   /* the read fails with EIO                      */
    MHA_IO_FAULT_SHORT = 1,  /* the read returns fewer bytes (retried)       */
    MHA_IO_FAULT_EOF = 2     /* the read returns 0 bytes (premature end)     */
} mha_io_fault;

/* Injects `fault` into the k-th read (mha_file_read call or map attempt)
 * from now on (k >= 1), and into every later one when persistent; k = 0
 * disables.  Writes fail too when k counts them (mha_wfile_write).
 * Returns nothing; mha_test_io_count() gives the operations so far. */
#ifdef MHA_TEST_HOOKS /* test builds only (docs/errors.md "Test hooks") */
MHA_API void mha_test_fail_io(int64_t k, int persistent, mha_io_fault fault);
MHA_API int64_t mha_test_io_count(void);
#endif

/* ---- conversions shared by the readers and writers ----------------------- */

/* IEEE half / bfloat16 <-> float, round to nearest even (ref: IEEE 754-2008
 * §4.3.1; NaN payloads kept quiet). */
float mha_half_to_float(uint16_t h);
uint16_t mha_float_to_half(float f);
float mha_bf16_to_float(uint16_t b);

/* Little-endian loads (the formats are little-endian; valid on any host). */
static inline uint16_t mha_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t mha_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t mha_le64(const uint8_t *p) {
    return (uint64_t)mha_le32(p) | (uint64_t)mha_le32(p + 4) << 32;
}

/* Loads a .npy from an opened file (path or memory); see mha_npy_load_any.
 * The fuzz target calls this on memory files. */
mha_status mha_npy_read(mha_file *f, mha_dtype want, int keep_kind, int as_mask,
                        mha_tensor *out, mha_dtype *file_dtype);

/* Opens safetensors bytes from an opened file (path or memory; f is taken
 * over and closed by mha_safetensors_free, or on failure).  The fuzz target
 * calls this on memory files. */
mha_status mha_safetensors_read(mha_file *f, mha_safetensors **st);

#endif /* MHA_IO_H */
