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

#include <limits.h>
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

/* The safe writer (file.c has the protocol in full): a regular-file target
 * is written to a temporary beside it, flushed, fsynced and renamed over it
 * (then the directory is fsynced); a non-regular target (device, FIFO,
 * /dev/stdout) is written directly.  Nothing but mha's own temporary is
 * ever removed.  The struct must not move while the file is open. */
typedef struct mha_wfile {
    void *fp;                /* FILE * of mha_safe_file_stream, or NULL      */
    int fd;                  /* the temporary (or direct target); -1: closed */
    int direct;              /* 1: a non-regular target, written in place    */
    int failed;              /* a step failed: the new file is not kept      */
    int err;                 /* errno of the first failed write              */
    const char *name;        /* the path as given, for messages (not owned)  */
    char tmp[PATH_MAX + 64]; /* the temporary's path; "": none (no allocation:
                                writing never fails for want of memory)     */
    char target[PATH_MAX];   /* the path renamed over (symlinks resolved)    */
} mha_wfile;
mha_status mha_wfile_create(mha_wfile *w, const char *path);
/* Writes n bytes (MHA_ERR_IO naming the path); after a failure every
 * later write fails at once. */
mha_status mha_wfile_write(mha_wfile *w, const void *buf, size_t n);
/* Flushes, fsyncs and closes the temporary: the new bytes are on disk but
 * the target is unchanged (lets a caller prepare several files first). */
mha_status mha_wfile_sync(mha_wfile *w);
/* mha_wfile_sync, then renames the temporary over the target and fsyncs
 * the directory.  On failure the target is unchanged (except when only the
 * directory's fsync failed: the new file is in place, durability unknown). */
mha_status mha_wfile_commit(mha_wfile *w);
/* Closes what is open and removes the temporary, if any; safe to repeat. */
void mha_wfile_discard(mha_wfile *w);
/* keep && nothing failed: mha_wfile_commit; then mha_wfile_discard. */
mha_status mha_wfile_finish(mha_wfile *w, int keep);

/* ---- test hook ----------------------------------------------------------- */

typedef enum mha_io_fault {
    MHA_IO_FAULT_FAIL = 0,   /* the read fails with EIO                      */
    MHA_IO_FAULT_SHORT = 1,  /* the read returns fewer bytes (retried)       */
    MHA_IO_FAULT_EOF = 2,    /* the read returns 0 bytes (premature end)     */
    MHA_IO_FAULT_NOSPACE = 3 /* the step fails with ENOSPC (reads: EIO)      */
} mha_io_fault;

/* Injects `fault` into the k-th read (mha_file_read call or map attempt)
 * from now on (k >= 1), and into every later one when persistent; k = 0
 * disables.  The safe writer's steps count too (creating the temporary,
 * each write(2), flush, fsync, rename, directory fsync): there FAIL is EIO,
 * NOSPACE is ENOSPC, SHORT shortens a write(2) (retried), EOF is EIO.
 * Returns nothing; mha_test_io_count() gives the operations so far. */
#ifdef MHA_TEST_HOOKS /* test builds only (docs/errors.md "Test hooks") */
MHA_API void mha_test_fail_io(int64_t k, int persistent, mha_io_fault fault);
MHA_API int64_t mha_test_io_count(void);
#endif

/* ---- conversions shared by the readers and writers ----------------------- */

/* IEEE half / bfloat16 <-> float: src/kernels/convert.h. */
#include "../kernels/convert.h"

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

/* mha_safetensors_write up to mha_wfile_sync: the new file is complete in
 * its temporary; the caller commits (mha_wfile_commit) or discards it.  On
 * failure nothing is left (w discarded).  Checkpoints write the model and
 * optimiser files this way, then rename both. */
mha_status mha_safetensors_write_synced(mha_wfile *w, const char *path,
                                        const char *const *names,
                                        const mha_tensor *const *tensors, int64_t n,
                                        const char *const *meta_keys,
                                        const char *const *meta_values, int64_t n_meta);

#endif /* MHA_IO_H */
