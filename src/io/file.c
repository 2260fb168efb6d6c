/* file.c - the library's one I/O layer: positional exact reads, mapping,
 * the safe writer (temporary, fsync, rename), and the fault injection hook
 * of test builds. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fault injection (test builds only: -DMHA_TEST_HOOKS) ------------------- */

#ifdef MHA_TEST_HOOKS
static _Atomic int64_t io_count;    /* read/map/write operations so far       */
static _Atomic int64_t io_fail_at;  /* operation that faults (0: none)        */
static _Atomic int io_persistent;
static _Atomic int io_fault;

void mha_test_fail_io(int64_t k, int persistent, mha_io_fault fault) {
    atomic_store(&io_persistent, persistent != 0);
    atomic_store(&io_fault, (int)fault);
    atomic_store(&io_fail_at, k > 0 ? atomic_load(&io_count) + k : 0);
}

int64_t mha_test_io_count(void) { return atomic_load(&io_count); }

/* -1 when this operation runs normally, else the fault to inject. */
static int injected_fault(void) {
    int64_t n = atomic_fetch_add(&io_count, 1) + 1;
    int64_t at = atomic_load(&io_fail_at);
    if (at == 0 || !(n == at || (atomic_load(&io_persistent) && n > at)))
        return -1;
    return atomic_load(&io_fault);
}
#else  /* release build: no hook */
static inline int injected_fault(void) { return -1; }
#endif

/* ---- reading ----------------------------------------------------------------- */

mha_status mha_file_open(mha_file *f, const char *path) {
    MHA_CHECK(f != NULL && path != NULL, MHA_ERR_NULL, "file: NULL path");
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->name = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    MHA_CHECK(fd >= 0, MHA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { /* GCOVR_EXCL_BR_LINE: fstat of an open descriptor */
        int e = errno;     /* GCOVR_EXCL_LINE */
        close(fd);         /* GCOVR_EXCL_LINE */
        return mha_error(MHA_ERR_IO, "%s: %s", path, strerror(e)); /* GCOVR_EXCL_LINE */
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mha_error(MHA_ERR_IO, "%s: not a regular file", path);
    }
    f->fd = fd;
    f->size = (int64_t)sb.st_size;
    return MHA_OK;
}

void mha_file_open_mem(mha_file *f, const uint8_t *mem, size_t size, const char *name) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->mem = mem;
    f->size = (int64_t)size;
    f->name = name ? name : "<memory>";
}

mha_status mha_file_read(mha_file *f, int64_t off, void *buf, size_t n, const char *what) {
    int64_t end;
    MHA_CHECK(off >= 0 && !__builtin_add_overflow(off, (int64_t)n, &end) && (int64_t)n >= 0 &&
                  end <= f->size,
              MHA_ERR_FORMAT, "%s: truncated: %s needs bytes %lld..%llu but the file has %lld",
              f->name, what, (long long)off, (unsigned long long)off + (unsigned long long)n,
              (long long)f->size); /* unsigned: the sum may not fit (no UB in the message) */
    uint8_t *dst = buf;
    while (n > 0) {
        int fault = injected_fault();
        size_t want = n;
        ssize_t got;
        if (fault == MHA_IO_FAULT_FAIL || fault == MHA_IO_FAULT_NOSPACE) {
            got = -1;
            errno = EIO;
        } else if (fault == MHA_IO_FAULT_EOF) {
            got = 0;
        } else {
            if (fault == MHA_IO_FAULT_SHORT && want > 1)
                want /= 2;
            if (f->fd < 0) {
                memcpy(dst, f->mem + off, want);
                got = (ssize_t)want;
            } else {
                do
                    got = pread(f->fd, dst, want, (off_t)off);
                while (got < 0 && errno == EINTR); /* GCOVR_EXCL_BR_LINE: needs a real EIO/EINTR */
            }
        }
        MHA_CHECK(got >= 0, MHA_ERR_IO, "%s: read error in %s: %s", f->name, what,
                  strerror(errno));
        MHA_CHECK(got > 0, MHA_ERR_FORMAT, "%s: truncated: end of file inside %s", f->name,
                  what);
        dst += got;
        off += got;
        n -= (size_t)got;
    }
    return MHA_OK;
}

mha_status mha_file_map(mha_file *f, const uint8_t **map) {
    *map = NULL;
    if (injected_fault() >= 0 || f->size <= 0)
        return MHA_OK; /* callers fall back to reading */
    if (f->fd < 0) {
        *map = f->mem;
        return MHA_OK;
    }
    if ((uint64_t)f->size > (uint64_t)SIZE_MAX)
        return MHA_OK;
    void *p = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (p != MAP_FAILED)
        *map = p;
    return MHA_OK;
}

void mha_file_unmap(mha_file *f, const uint8_t *map) {
    if (map && f->fd >= 0)
        munmap((void *)map, (size_t)f->size);
}

void mha_file_close(mha_file *f) {
    if (f && f->fd >= 0)
        close(f->fd);
    if (f)
        f->fd = -1;
}

/* ---- writing: the one safe writer ---------------------------------------------
 *
 * Every file mha writes goes through here.  A regular-file target (or a
 * path that does not exist yet) is written to a temporary beside it,
 * ".<name>.<pid>.<n>.mha-tmp" in the same directory (O_CREAT|O_EXCL, mode
 * 0666 less the umask, or the replaced file's permission bits), which is
 * flushed, fsynced and closed, then renamed over the target, then the
 * directory is fsynced: the target is always either the old file or the
 * complete new one, and a reader that has the old file mapped keeps reading
 * the old bytes.  A symlink to a regular file is written through: the
 * temporary goes beside the file the link names and replaces that file; the
 * link stays.  A non-regular existing target (device, FIFO, socket,
 * terminal) and any path under /dev/ or /proc/ (/dev/stdout, even when it
 * names a regular file) is opened and written directly, never renamed over
 * and never removed.  On failure only mha's own temporary is removed.
 *
 * Each step is a fault-injection point (mha_test_fail_io): creating the
 * temporary, every write(2), the flush of the stream, fsync, rename and the
 * directory's fsync.
 */

static int fault_errno(int fault) { return fault == MHA_IO_FAULT_NOSPACE ? ENOSPC : EIO; }

/* 1 (errno set) when the fault hook fails this step; a short fault only
 * shortens writes. */
static int step_fails(void) {
    int fault = injected_fault();
    if (fault < 0 || fault == MHA_IO_FAULT_SHORT)
        return 0;
    errno = fault_errno(fault);
    return 1;
}

/* Paths written directly: the kernel's own trees (/dev/stdout, /proc/self/fd/N). */
static int kernel_path(const char *p) { return !strncmp(p, "/dev/", 5) || !strncmp(p, "/proc/", 6); }

/* Creates the temporary beside w->target; w->fd and w->tmp on success. */
static mha_status create_temporary(mha_wfile *w, const struct stat *old) {
    static _Atomic unsigned serial;
    const char *slash = strrchr(w->target, '/');
    size_t dirlen = slash ? (size_t)(slash - w->target) + 1 : 0;
    for (int attempt = 0;; attempt++) {
        snprintf(w->tmp, sizeof w->tmp, "%.*s.%s.%ld.%u.mha-tmp", (int)dirlen, w->target,
                 w->target + dirlen, (long)getpid(), atomic_fetch_add(&serial, 1));
        int fd = step_fails() ? -1 : open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            w->fd = fd;
            if (old) /* keep the replaced file's permissions, as rewriting it in place would */
                (void)fchmod(fd, old->st_mode & 07777);
            return MHA_OK;
        }
        if (errno != EEXIST || attempt == 100) { /* GCOVR_EXCL_BR_LINE: 100 name clashes */
            int e = errno;
            w->tmp[0] = '\0';
            return mha_error(MHA_ERR_IO, "%s: cannot create a temporary beside it: %s", w->name,
                             strerror(e));
        }
    }
}

mha_status mha_wfile_create(mha_wfile *w, const char *path) {
    MHA_CHECK(w != NULL && path != NULL, MHA_ERR_NULL, "file: NULL path");
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->name = path;
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    MHA_CHECK(exists || errno == ENOENT, MHA_ERR_IO, "%s: cannot create: %s", path,
              strerror(errno));
    if (exists && (!S_ISREG(sb.st_mode) || kernel_path(path))) {
        w->direct = 1;
        int fd = open(path, O_WRONLY | O_CLOEXEC | (S_ISREG(sb.st_mode) ? O_TRUNC : 0));
        MHA_CHECK(fd >= 0, MHA_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
        w->fd = fd;
        return MHA_OK;
    }
    if (exists) {
        MHA_CHECK(realpath(path, w->target) != NULL, MHA_ERR_IO, /* GCOVR_EXCL_BR_LINE: raced */
                  "%s: cannot resolve: %s", path, strerror(errno));
    } else {
        MHA_CHECK(strlen(path) < sizeof w->target, MHA_ERR_IO, "%s: path too long", path);
        snprintf(w->target, sizeof w->target, "%s", path);
    }
    return create_temporary(w, exists ? &sb : NULL);
}

/* Writes all n bytes to w->fd, retrying short writes and EINTR; each
 * write(2) is an injection point.  0, or -1 with w->err set. */
static int write_all(mha_wfile *w, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        int fault = injected_fault();
        size_t want = n;
        ssize_t got;
        if (fault >= 0 && fault != MHA_IO_FAULT_SHORT) {
            got = -1;
            errno = fault_errno(fault);
        } else {
            if (fault == MHA_IO_FAULT_SHORT && want > 1)
                want /= 2;
            got = write(w->fd, p, want);
            if (got < 0 && errno == EINTR) /* GCOVR_EXCL_BR_LINE: needs a signal mid-write */
                continue;                  /* GCOVR_EXCL_LINE */
        }
        if (got <= 0) {
            w->err = got < 0 ? errno : EIO;
            w->failed = 1;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

mha_status mha_wfile_write(mha_wfile *w, const void *buf, size_t n) {
    if (w->failed)
        return MHA_ERR_IO;
    if (n == 0)
        return MHA_OK;
    MHA_CHECK(write_all(w, buf, n) == 0, MHA_ERR_IO, "%s: write error: %s", w->name,
              strerror(w->err));
    return MHA_OK;
}

/* The stdio stream of mha_safe_file: its buffer drains through write_all. */
static ssize_t stream_write(void *cookie, const char *buf, size_t n) {
    mha_wfile *w = cookie;
    return w->failed || write_all(w, buf, n) != 0 ? -1 : (ssize_t)n;
}

mha_status mha_wfile_sync(mha_wfile *w) {
    if (w->fp) {
        if (!w->failed && step_fails()) /* the flush step */
            w->err = errno, w->failed = 1;
        if (!w->failed && fflush(w->fp) != 0)
            w->err = w->err ? w->err : errno, w->failed = 1;
        w->failed |= ferror((FILE *)w->fp) != 0;
        fclose(w->fp); /* after a failure stream_write refuses: nothing more is written */
        w->fp = NULL;
    }
    if (w->failed)
        return mha_error(MHA_ERR_IO, "%s: write error: %s", w->name,
                         strerror(w->err ? w->err : EIO));
    if (w->fd < 0)
        return MHA_OK; /* synced already */
    int e = 0;
    const char *what = NULL;
    if (!w->direct && (step_fails() || fsync(w->fd) != 0))
        e = errno, what = "fsync failed";
    if (close(w->fd) != 0 && !what) /* GCOVR_EXCL_BR_LINE: close fails only on NFS-like mounts */
        e = errno, what = "write error on close"; /* GCOVR_EXCL_LINE */
    w->fd = -1;
    if (what) {
        w->err = e, w->failed = 1;
        return mha_error(MHA_ERR_IO, "%s: %s: %s", w->name, what, strerror(e));
    }
    return MHA_OK;
}

/* fsyncs the directory holding path (EINVAL: a file system without it). */
static int sync_directory(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (step_fails())
        return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) /* GCOVR_EXCL_BR_LINE: the directory was just written to */
        return -1;
    int rc = fsync(fd) != 0 && errno != EINVAL ? -1 : 0;
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

mha_status mha_wfile_commit(mha_wfile *w) {
    mha_status st = mha_wfile_sync(w);
    if (st != MHA_OK || w->direct || !w->tmp[0])
        return st;
    if (step_fails() || rename(w->tmp, w->target) != 0) {
        int e = errno;
        w->failed = 1;
        return mha_error(MHA_ERR_IO, "%s: cannot replace it with the new file: %s", w->name,
                         strerror(e));
    }
    w->tmp[0] = '\0'; /* it is the target now */
    MHA_CHECK(sync_directory(w->target) == 0, MHA_ERR_IO,
              "%s: written, but syncing its directory failed: %s", w->name, strerror(errno));
    return MHA_OK;
}

void mha_wfile_discard(mha_wfile *w) {
    if (w->fp || w->fd >= 0) {
        w->failed = 1;
        if (w->fp)
            fclose(w->fp);
        if (w->fd >= 0)
            close(w->fd);
    }
    w->fp = NULL;
    w->fd = -1;
    if (w->tmp[0])
        unlink(w->tmp); /* ours (O_EXCL): the only path a failure removes */
    w->tmp[0] = '\0';
}

mha_status mha_wfile_finish(mha_wfile *w, int keep) {
    if (w->fd < 0 && !w->fp && !w->tmp[0])
        return MHA_OK; /* finished already */
    mha_status st = w->failed ? MHA_ERR_IO : MHA_OK;
    if (keep && st == MHA_OK)
        st = mha_wfile_commit(w);
    mha_wfile_discard(w);
    return st;
}

/* ---- the public handle ---------------------------------------------------------- */

struct mha_safe_file {
    mha_wfile w;
};

mha_status mha_safe_file_open(mha_safe_file **out, const char *path) {
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "safe file: NULL out");
    *out = NULL;
    mha_safe_file *f = mha_malloc(sizeof *f);
    MHA_CHECK(f != NULL, MHA_ERR_NOMEM, "%s: cannot allocate", path ? path : "safe file");
    mha_status st = mha_wfile_create(&f->w, path);
    if (st == MHA_OK) {
        cookie_io_functions_t io = {NULL, stream_write, NULL, NULL};
        f->w.fp = fopencookie(&f->w, "w", io);
        if (!f->w.fp) { /* GCOVR_EXCL_BR_LINE: malloc failure inside libc */
            mha_wfile_discard(&f->w);           /* GCOVR_EXCL_LINE */
            st = mha_error(MHA_ERR_NOMEM, "%s: cannot allocate a stream", path); /* GCOVR_EXCL_LINE */
        }
    }
    if (st != MHA_OK) {
        mha_free(f);
        return st;
    }
    *out = f;
    return MHA_OK;
}

FILE *mha_safe_file_stream(mha_safe_file *f) { return f ? f->w.fp : NULL; }

mha_status mha_safe_file_close(mha_safe_file *f, int keep) {
    if (!f)
        return MHA_OK;
    mha_status st = keep ? mha_wfile_commit(&f->w) : MHA_OK;
    mha_wfile_discard(&f->w);
    mha_free(f);
    return st;
}
