/* file.c - the library's one I/O layer: positional exact reads, mapping,
 * buffered writes, and the fault injection hook of test builds. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
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
        if (fault == MHA_IO_FAULT_FAIL) {
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

/* ---- writing ----------------------------------------------------------------- */

mha_status mha_wfile_create(mha_wfile *w, const char *path) {
    MHA_CHECK(w != NULL && path != NULL, MHA_ERR_NULL, "file: NULL path");
    memset(w, 0, sizeof *w);
    w->name = path;
    FILE *fp = fopen(path, "wb");
    MHA_CHECK(fp != NULL, MHA_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    w->fp = fp;
    return MHA_OK;
}

mha_status mha_wfile_write(mha_wfile *w, const void *buf, size_t n) {
    if (w->failed)
        return MHA_ERR_IO;
    if (n == 0)
        return MHA_OK;
    int fault = injected_fault();
    if (fault >= 0 || fwrite(buf, 1, n, (FILE *)w->fp) != n) {
        w->failed = 1;
        return mha_error(MHA_ERR_IO, "%s: write error: %s", w->name,
                         fault >= 0 ? "injected" : strerror(errno));
    }
    return MHA_OK;
}

mha_status mha_wfile_finish(mha_wfile *w, int keep) {
    if (!w->fp)
        return MHA_OK;
    int err = fclose((FILE *)w->fp) != 0;
    w->fp = NULL;
    if (err || w->failed || !keep) {
        remove(w->name);
        if (err && !w->failed)
            return mha_error(MHA_ERR_IO, "%s: write error on close: %s", w->name,
                             strerror(errno));
        return w->failed ? MHA_ERR_IO : MHA_OK;
    }
    return MHA_OK;
}

/* ---- conversions ------------------------------------------------------------- */

float mha_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: value = man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t mha_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (ties-to-even at max) */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half 2^-14 */
        /* ref: exact integer rounding of ax scaled by 2^24 (subnormal unit) */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
            return sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        int shift = (int)(126 - e); /* value = m * 2^(e-150) = q * 2^-24: drop bits */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10)); /* rebias exponent, keep 10 bits */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1)))
        q++; /* may carry into the exponent, correctly */
    return (uint16_t)(sign | q);
}

float mha_bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
