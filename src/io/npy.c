/* npy.c - NumPy .npy files: a hostile-input reader and a numpy.save writer.
 *
 * FORMAT (NEP 1 and numpy/lib/format.py)
 *
 *   offset  size  field
 *   0       6     magic "\x93NUMPY"
 *   6       1     major version: 1, 2 or 3
 *   7       1     minor version: 0
 *   8       2|4   HEADER_LEN, little-endian: u16 for 1.0, u32 for 2.0 and 3.0
 *   10|12   HLEN  header: a Python dict literal, latin-1 (1.0, 2.0) or UTF-8
 *                 (3.0), padded with spaces and ended by '\n', e.g.
 *                 {'descr': '<f4', 'fortran_order': False, 'shape': (7, 8), }
 *   ...     N     data: prod(shape) elements of descr, C order unless
 *                 fortran_order is True; shape () is one element.
 *
 * WHAT IS READ
 *   descr '<f4' '<f8' '<f2' '<u2' '|b1' '|u1' '<i4' '<i8' (also '<b1' '<u1'
 *   '|i1' '<i1'; '|f..' never).  '<u2' is raw bfloat16 bits, what NumPy-based
 *   tools without a bfloat16 dtype write (arr.view(np.uint16)): it loads as
 *   bfloat16 everywhere (exactly widened for MHA_F32, copied for MHA_BF16)
 *   and is refused as integers.  Floats loaded as MHA_BF16 or MHA_F16 round
 *   to nearest even ('<f8' through float32 first, as torch and ml_dtypes
 *   do).  Big-endian ('>') and native-order-on-other-hosts
 *   descrs, structured ('[...]') and object ('|O', pickles) arrays are
 *   rejected with a message saying so.  fortran_order True is read and
 *   transposed into C order.  At most MHA_MAX_DIMS (4) dimensions.
 *
 * CHECKS, all before any allocation
 *   magic; version in {1.0, 2.0, 3.0}; HEADER_LEN <= NPY_MAX_HEADER and
 *   inside the file; the header is exactly the literal subset above (keys
 *   descr, fortran_order, shape, each exactly once, nothing else; quotes
 *   ' or "; an optional trailing comma; only spaces/newlines after '}');
 *   sizes are non-negative decimal integers below 2^63; prod(shape) and
 *   prod(shape) * itemsize are overflow-checked; the data section is exactly
 *   the rest of the file (shorter: "truncated", longer: "trailing bytes").
 *   The header is parsed, never evaluated.
 *
 * WHAT IS WRITTEN
 *   '<f4', '<f2', '|b1', and MHA_BF16 as '<u2' raw bits (what
 *   numpy.save(arr_bf16_bits.view(np.uint16)) writes); a float tensor of any
 *   float dtype is written as any float dtype, each value rounded once.
 *   Version 1.0, byte-identical to numpy.save of NumPy 1.24: keys sorted,
 *   repr() of the values, 21 - len(str(shape[0])) spare spaces for growth
 *   (none for 0-d), then spaces and '\n' so that the data starts at a
 *   multiple of 64.
 */
#include "io.h"

#include <stdio.h>
#include <string.h>

#define NPY_MAX_HEADER 65536 /* numpy itself refuses > 10000 by default */
#define NPY_CHUNK 65536      /* bytes converted per read                */

/* NPY_BF16: '<u2' holding raw bfloat16 bits (see WHAT IS READ). */
typedef enum npy_kind { NPY_FLOAT, NPY_BF16, NPY_BOOL, NPY_UINT, NPY_INT } npy_kind;

typedef struct npy_header {
    npy_kind kind;
    size_t itemsize;
    char descr[16];
    int fortran;
    int ndim;
    int64_t shape[MHA_MAX_DIMS];
    int64_t numel;
    int64_t data_off;
} npy_header;

/* ---- header parsing ------------------------------------------------------- */

typedef struct hparse {
    const char *s, *end;
    const char *name; /* file name for messages */
} hparse;

static void skip_ws(hparse *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

/* A quoted string ('x' or "x", no escapes) into buf. */
static mha_status parse_str(hparse *p, char *buf, size_t size, const char *what) {
    MHA_CHECK(p->s < p->end && (*p->s == '\'' || *p->s == '"'), /* GCOVR_EXCL_BR_LINE */
              MHA_ERR_FORMAT, "%s: bad .npy header: expected a quoted %s", p->name, what);
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        MHA_CHECK(*p->s != '\\' && (unsigned char)*p->s >= 0x20, MHA_ERR_FORMAT,
                  "%s: bad .npy header: unsupported character in %s", p->name, what);
        MHA_CHECK(n + 1 < size, MHA_ERR_FORMAT, "%s: bad .npy header: %s too long", p->name,
                  what);
        buf[n++] = *p->s++;
    }
    MHA_CHECK(p->s < p->end, MHA_ERR_FORMAT, "%s: bad .npy header: unterminated %s", p->name,
              what);
    p->s++;
    buf[n] = 0;
    return MHA_OK;
}

static mha_status parse_descr(hparse *p, npy_header *h) {
    MHA_CHECK(p->s < p->end && *p->s != '[', MHA_ERR_UNSUPPORTED,
              "%s: descr: structured dtypes are not supported", p->name);
    MHA_TRY(parse_str(p, h->descr, sizeof h->descr, "descr"));
    static const struct {
        const char *descr;
        npy_kind kind;
        size_t size;
    } known[] = {
        {"<f4", NPY_FLOAT, 4}, {"<f8", NPY_FLOAT, 8}, {"<f2", NPY_FLOAT, 2},
        {"|b1", NPY_BOOL, 1},  {"<b1", NPY_BOOL, 1},  {"|u1", NPY_UINT, 1},
        {"<u1", NPY_UINT, 1},  {"|i1", NPY_INT, 1},   {"<i1", NPY_INT, 1},
        {"<i4", NPY_INT, 4},   {"<i8", NPY_INT, 8},   {"<u2", NPY_BF16, 2},
    };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(h->descr, known[i].descr)) {
            h->kind = known[i].kind;
            h->itemsize = known[i].size;
            return MHA_OK;
        }
    const char *d = h->descr;
    MHA_CHECK(d[0] != '>', MHA_ERR_UNSUPPORTED,
              "%s: descr: big-endian dtype '%s' is not supported (save it with "
              "arr.astype(arr.dtype.newbyteorder('<')))",
              p->name, d);
    MHA_CHECK(strchr(d, 'O') == NULL, MHA_ERR_UNSUPPORTED,
              "%s: descr: object arrays (pickles) are not supported", p->name);
    return mha_error(MHA_ERR_UNSUPPORTED,
                     "%s: descr: dtype '%s' is not supported (want <f4 <f8 <f2 "
                     "<u2 (bfloat16 bits) |b1 |u1 <i4 <i8)",
                     p->name, d);
}

static mha_status parse_bool(hparse *p, int *v) {
    if (p->end - p->s >= 4 && !memcmp(p->s, "True", 4)) {
        p->s += 4;
        *v = 1;
        return MHA_OK;
    }
    if (p->end - p->s >= 5 && !memcmp(p->s, "False", 5)) {
        p->s += 5;
        *v = 0;
        return MHA_OK;
    }
    return mha_error(MHA_ERR_FORMAT, "%s: bad .npy header: fortran_order is not True or False",
                     p->name);
}

static mha_status parse_shape(hparse *p, npy_header *h) {
    MHA_CHECK(p->s < p->end && *p->s == '(', MHA_ERR_FORMAT,
              "%s: bad .npy header: shape is not a tuple", p->name);
    p->s++;
    int n = 0, trailing_comma = 0;
    for (;;) {
        skip_ws(p);
        MHA_CHECK(p->s < p->end, MHA_ERR_FORMAT, "%s: bad .npy header: unterminated shape",
                  p->name);
        if (*p->s == ')')
            break;
        MHA_CHECK(*p->s != '-', MHA_ERR_FORMAT, "%s: shape: negative size", p->name);
        MHA_CHECK(*p->s >= '0' && *p->s <= '9', MHA_ERR_FORMAT,
                  "%s: shape: '%c' is not a size", p->name, *p->s);
        MHA_CHECK(n < MHA_MAX_DIMS, MHA_ERR_UNSUPPORTED,
                  "%s: shape: more than %d dimensions", p->name, MHA_MAX_DIMS);
        int64_t v = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            MHA_CHECK(!mha_mul_overflows(v, 10, &v) && !__builtin_add_overflow(v, *p->s - '0', &v),
                      MHA_ERR_OVERFLOW, "%s: shape: size does not fit in 64 bits", p->name);
            p->s++;
        }
        if (p->s < p->end && *p->s == 'L') /* Python 2 long */
            p->s++;
        h->shape[n++] = v;
        skip_ws(p);
        trailing_comma = 0;
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            trailing_comma = 1;
        } else {
            MHA_CHECK(p->s < p->end && *p->s == ')', MHA_ERR_FORMAT,
                      "%s: bad .npy header: expected ',' or ')' in shape", p->name);
        }
    }
    p->s++;
    MHA_CHECK(n != 1 || trailing_comma, MHA_ERR_FORMAT,
              "%s: bad .npy header: shape (n) is not a tuple; write (n,)", p->name);
    h->ndim = n;
    return MHA_OK;
}

static mha_status parse_header(const char *text, size_t len, const char *name, npy_header *h) {
    hparse p = {text, text + len, name};
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    skip_ws(&p);
    MHA_CHECK(p.s < p.end && *p.s == '{', MHA_ERR_FORMAT,
              "%s: bad .npy header: does not start with '{'", name);
    p.s++;
    for (;;) {
        skip_ws(&p);
        MHA_CHECK(p.s < p.end, MHA_ERR_FORMAT, "%s: bad .npy header: unterminated dict", name);
        if (*p.s == '}')
            break;
        char key[32];
        MHA_TRY(parse_str(&p, key, sizeof key, "key"));
        skip_ws(&p);
        MHA_CHECK(p.s < p.end && *p.s == ':', MHA_ERR_FORMAT,
                  "%s: bad .npy header: expected ':' after '%s'", name, key);
        p.s++;
        skip_ws(&p);
        if (!strcmp(key, "descr")) {
            MHA_CHECK(!seen_descr++, MHA_ERR_FORMAT, "%s: bad .npy header: duplicate key descr",
                      name);
            MHA_TRY(parse_descr(&p, h));
        } else if (!strcmp(key, "fortran_order")) {
            MHA_CHECK(!seen_fortran++, MHA_ERR_FORMAT,
                      "%s: bad .npy header: duplicate key fortran_order", name);
            MHA_TRY(parse_bool(&p, &h->fortran));
        } else if (!strcmp(key, "shape")) {
            MHA_CHECK(!seen_shape++, MHA_ERR_FORMAT, "%s: bad .npy header: duplicate key shape",
                      name);
            MHA_TRY(parse_shape(&p, h));
        } else {
            return mha_error(MHA_ERR_FORMAT, "%s: bad .npy header: unknown key '%s'", name, key);
        }
        skip_ws(&p);
        MHA_CHECK(p.s < p.end && (*p.s == ',' || *p.s == '}'), MHA_ERR_FORMAT,
                  "%s: bad .npy header: expected ',' or '}' after '%s'", name, key);
        if (*p.s == ',')
            p.s++;
    }
    p.s++;
    skip_ws(&p);
    MHA_CHECK(p.s == p.end, MHA_ERR_FORMAT, "%s: bad .npy header: text after the dict", name);
    MHA_CHECK(seen_descr && seen_fortran && seen_shape, MHA_ERR_FORMAT,
              "%s: bad .npy header: missing key %s", name,
              !seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape");
    return MHA_OK;
}

/* Reads and validates everything up to the data; no allocation. */
static mha_status read_header(mha_file *f, npy_header *h) {
    memset(h, 0, sizeof *h);
    uint8_t pre[12];
    MHA_CHECK(f->size >= 10, MHA_ERR_FORMAT, "%s: not a .npy file: %lld bytes is too short",
              f->name, (long long)f->size);
    MHA_TRY(mha_file_read(f, 0, pre, 10, ".npy prefix"));
    MHA_CHECK(!memcmp(pre, "\x93NUMPY", 6), MHA_ERR_FORMAT,
              "%s: not a .npy file (bad magic)", f->name);
    int major = pre[6], minor = pre[7];
    MHA_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, MHA_ERR_FORMAT,
              "%s: .npy version %d.%d is not supported (1.0, 2.0, 3.0)", f->name, major, minor);
    uint64_t hlen;
    int64_t pos;
    if (major == 1) {
        hlen = mha_le16(pre + 8);
        pos = 10;
    } else {
        MHA_TRY(mha_file_read(f, 10, pre + 10, 2, ".npy header length"));
        hlen = mha_le32(pre + 8);
        pos = 12;
    }
    MHA_CHECK(hlen <= NPY_MAX_HEADER, MHA_ERR_FORMAT,
              "%s: .npy header length %llu exceeds the %d-byte limit", f->name,
              (unsigned long long)hlen, NPY_MAX_HEADER);
    MHA_CHECK((int64_t)hlen <= f->size - pos, MHA_ERR_FORMAT,
              "%s: truncated: .npy header length %llu but only %lld bytes follow", f->name,
              (unsigned long long)hlen, (long long)(f->size - pos));
    char text[NPY_MAX_HEADER];
    MHA_TRY(mha_file_read(f, pos, text, (size_t)hlen, ".npy header"));
    MHA_TRY(parse_header(text, (size_t)hlen, f->name, h));
    h->data_off = pos + (int64_t)hlen;

    int64_t bytes;
    MHA_CHECK(mha_product(h->shape, h->ndim, &h->numel) &&
                  !mha_mul_overflows(h->numel, (int64_t)h->itemsize, &bytes),
              MHA_ERR_OVERFLOW, "%s: shape: element count overflows", f->name);
    int64_t have = f->size - h->data_off;
    MHA_CHECK(have >= bytes, MHA_ERR_FORMAT,
              "%s: truncated: shape needs %lld data bytes but the file has %lld", f->name,
              (long long)bytes, (long long)have);
    MHA_CHECK(have == bytes, MHA_ERR_FORMAT,
              "%s: %lld trailing bytes after the %lld data bytes of the shape", f->name,
              (long long)(have - bytes), (long long)bytes);
    return MHA_OK;
}

/* ---- data conversion -------------------------------------------------------- */

/* Element i of raw data of kind/itemsize as double (exact for every kind
 * but i8 beyond 2^53, which only feeds float32 anyway). */
static double raw_double(const uint8_t *p, const npy_header *h) {
    switch (h->kind) { /* GCOVR_EXCL_BR_LINE: h->kind is one of the five npy_kind values */
    case NPY_FLOAT:
        if (h->itemsize == 2) /* GCOVR_EXCL_BR_LINE: raw_float handles f2 itself */
            return mha_half_to_float(mha_le16(p));
        if (h->itemsize == 4) { /* GCOVR_EXCL_BR_LINE: raw_float handles f4 itself */
            uint32_t u = mha_le32(p);
            float f;
            memcpy(&f, &u, 4);
            return f;
        } else {
            uint64_t u = mha_le64(p);
            double d;
            memcpy(&d, &u, 8);
            return d;
        }
    case NPY_BF16:
        return mha_bf16_to_float(mha_le16(p));
    case NPY_BOOL:
        return p[0] != 0;
    case NPY_UINT:
        return p[0];
    case NPY_INT:
        if (h->itemsize == 1)
            return (int8_t)p[0];
        if (h->itemsize == 4)
            return (int32_t)mha_le32(p);
        return (double)(int64_t)mha_le64(p);
    }
    return 0;
}

/* As float without a detour through double for f2/f4, so NaN payloads
 * survive exactly as NumPy's astype(float32) keeps them. */
static float raw_float(const uint8_t *p, const npy_header *h) {
    if (h->kind == NPY_BF16)
        return mha_bf16_to_float(mha_le16(p));
    if (h->kind == NPY_FLOAT && h->itemsize == 2)
        return mha_half_to_float(mha_le16(p));
    if (h->kind == NPY_FLOAT && h->itemsize == 4) {
        uint32_t u = mha_le32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return (float)raw_double(p, h);
}

static int64_t raw_int(const uint8_t *p, const npy_header *h) {
    if (h->kind == NPY_INT) {
        if (h->itemsize == 1)
            return (int8_t)p[0];
        if (h->itemsize == 4) /* GCOVR_EXCL_BR_LINE (docs/coverage.md) */
            return (int32_t)mha_le32(p);
        return (int64_t)mha_le64(p);
    }
    return p[0];
}

static int is_float_kind(const npy_header *h) {
    return h->kind == NPY_FLOAT || h->kind == NPY_BF16;
}

static int raw_truth(const uint8_t *p, const npy_header *h) {
    for (size_t i = 0; i < h->itemsize; i++)
        if (p[i] & (is_float_kind(h) && i == h->itemsize - 1 ? 0x7f : 0xff))
            return 1; /* any bit besides the sign bit: nonzero (NaN is true) */
    return 0;
}

static void convert(void *dst, mha_dtype want, const uint8_t *src, int64_t n, const npy_header *h) {
    for (int64_t i = 0; i < n; i++, src += h->itemsize) {
        switch (want) { /* GCOVR_EXCL_BR_LINE (docs/coverage.md) */
        case MHA_F32: ((float *)dst)[i] = raw_float(src, h); break;
        case MHA_F16:
            ((uint16_t *)dst)[i] =
                h->kind == NPY_FLOAT && h->itemsize == 2 /* GCOVR_EXCL_BR_LINE */
                    ? mha_le16(src)
                    : mha_float_to_half(raw_float(src, h));
            break;
        case MHA_BF16: /* '<u2' is already bfloat16; '<f8' rounds via float32 as torch does */
            ((uint16_t *)dst)[i] = h->kind == NPY_BF16 ? mha_le16(src)
                                                       : mha_float_to_bf16(raw_float(src, h));
            break;
        case MHA_BOOL: ((uint8_t *)dst)[i] = (uint8_t)raw_truth(src, h); break;
        case MHA_I64: ((int64_t *)dst)[i] = raw_int(src, h); break;
        }
    }
}

/* Fortran order: the data is the C order of the reversed shape. */
static mha_status transpose_fortran(mha_tensor *t) {
    size_t es = mha_dtype_size(t->dtype);
    int64_t n;
    MHA_TRY(mha_tensor_numel(t, &n)); /* GCOVR_EXCL_BR_LINE: t was allocated with this shape */
    if (t->ndim < 2 || n == 0)
        return MHA_OK;
    uint8_t *dst = mha_malloc((size_t)n * es);
    MHA_CHECK(dst != NULL, MHA_ERR_NOMEM, "npy: cannot allocate %lld bytes to transpose",
              (long long)n * (long long)es);
    const uint8_t *src = t->data;
    int64_t idx[MHA_MAX_DIMS] = {0};
    for (int64_t c = 0; c < n; c++) { /* c walks the C order of t->shape */
        int64_t off = 0, mul = 1;
        for (int k = 0; k < t->ndim; k++) {
            off += idx[k] * mul;
            mul *= t->shape[k];
        }
        memcpy(dst + c * (int64_t)es, src + off * (int64_t)es, es);
        for (int k = t->ndim - 1; k >= 0; k--) {
            if (++idx[k] < t->shape[k])
                break;
            idx[k] = 0;
        }
    }
    mha_free(t->data);
    t->data = dst;
    return MHA_OK;
}

static mha_dtype kind_dtype(const npy_header *h) {
    switch (h->kind) {
    case NPY_FLOAT: return h->itemsize == 2 ? MHA_F16 : MHA_F32;
    case NPY_BF16: return MHA_BF16;
    case NPY_BOOL: return MHA_BOOL;
    default: return MHA_I64;
    }
}

mha_status mha_npy_read(mha_file *f, mha_dtype want, int keep_kind, int as_mask, mha_tensor *out,
                        mha_dtype *file_dtype) {
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "npy: NULL output tensor");
    memset(out, 0, sizeof *out);
    npy_header h;
    MHA_TRY(read_header(f, &h));
    if (file_dtype)
        *file_dtype = kind_dtype(&h);
    if (keep_kind)
        want = is_float_kind(&h) ? MHA_F32 : (as_mask || h.kind == NPY_BOOL) ? MHA_BOOL : MHA_I64;
    MHA_CHECK(want != MHA_I64 || !is_float_kind(&h), MHA_ERR_DTYPE,
              "%s: dtype %s holds %s but integers are needed", f->name, h.descr,
              h.kind == NPY_BF16 ? "bfloat16 bits (mha reads <u2 as bfloat16)" : "floats");
    MHA_CHECK(mha_dtype_size(want) != 0, MHA_ERR_DTYPE, "npy: unknown dtype %d", (int)want);

    int64_t shape[MHA_MAX_DIMS];
    for (int k = 0; k < h.ndim; k++) /* Fortran data is C order of the reversed shape */
        shape[k] = h.fortran ? h.shape[h.ndim - 1 - k] : h.shape[k];
    mha_tensor t;
    MHA_TRY(mha_tensor_create(&t, want, h.ndim, shape));
    mha_status st = MHA_OK;
    size_t es = mha_dtype_size(want);
    if (h.numel > 0 && es == h.itemsize && kind_dtype(&h) == want && want != MHA_BOOL) {
        /* same representation (little-endian host assumed by the library) */
        st = mha_file_read(f, h.data_off, t.data, (size_t)h.numel * es, ".npy data");
    } else if (h.numel > 0) {
        int64_t per = NPY_CHUNK / (int64_t)h.itemsize;
        uint8_t *buf = mha_malloc(NPY_CHUNK);
        if (!buf)
            st = mha_error(MHA_ERR_NOMEM, "npy: cannot allocate a read buffer");
        for (int64_t i = 0; st == MHA_OK && i < h.numel; i += per) {
            int64_t n = h.numel - i < per ? h.numel - i : per;
            st = mha_file_read(f, h.data_off + i * (int64_t)h.itemsize, buf,
                               (size_t)n * h.itemsize, ".npy data");
            if (st == MHA_OK)
                convert((uint8_t *)t.data + i * (int64_t)es, want, buf, n, &h);
        }
        mha_free(buf);
    }
    if (st == MHA_OK && h.fortran) {
        for (int k = 0; k < h.ndim; k++)
            t.shape[k] = h.shape[k];
        /* t holds the reversed-shape C data; transpose in place of the view */
        mha_tensor rev = t;
        for (int k = 0; k < h.ndim; k++)
            rev.shape[k] = h.shape[k];
        st = transpose_fortran(&rev);
        if (st == MHA_OK)
            st = mha_tensor_init(&t, want, rev.data, h.ndim, h.shape);
        t.data = rev.data;
    }
    if (st != MHA_OK) {
        mha_tensor_free(&t);
        return st;
    }
    *out = t;
    return MHA_OK;
}

static mha_status load_path(const char *path, mha_dtype want, int keep_kind, int as_mask,
                            mha_tensor *out, mha_dtype *file_dtype) {
    MHA_CHECK(out != NULL, MHA_ERR_NULL, "npy: NULL output tensor");
    memset(out, 0, sizeof *out);
    mha_file f;
    MHA_TRY(mha_file_open(&f, path));
    mha_status st = mha_npy_read(&f, want, keep_kind, as_mask, out, file_dtype);
    mha_file_close(&f);
    return st;
}

mha_status mha_npy_load(mha_tensor *out, const char *path, mha_dtype want) {
    return load_path(path, want, 0, 0, out, NULL);
}

mha_status mha_npy_load_any(mha_tensor *out, mha_dtype *file_dtype, const char *path,
                            int as_mask) {
    return load_path(path, MHA_F32, 1, as_mask, out, file_dtype);
}

/* ---- writing ---------------------------------------------------------------- */

/* x rounded once to the float dtype `as`, as little-endian file bytes. */
static void put_float(uint8_t *dst, mha_dtype as, float x) {
    union {
        float f;
        uint16_t h;
    } e;
    if (as == MHA_F32)
        e.f = x;
    else
        e.h = as == MHA_F16 ? mha_float_to_half(x) : mha_float_to_bf16(x);
    memcpy(dst, &e, mha_dtype_size(as)); /* little-endian host */
}

mha_status mha_npy_save(const mha_tensor *t, const char *path, mha_dtype as) {
    MHA_CHECK(path != NULL && t != NULL, MHA_ERR_NULL, "npy: NULL path or tensor");
    MHA_CHECK(t->ndim >= 0 && t->ndim <= MHA_MAX_DIMS, MHA_ERR_SHAPE,
              "npy: %d dimensions (at most %d)", t->ndim, MHA_MAX_DIMS);
    const int float_pair = mha_dtype_is_float(t->dtype) && mha_dtype_is_float(as);
    MHA_CHECK(float_pair || (t->dtype == MHA_BOOL && as == MHA_BOOL), MHA_ERR_DTYPE,
              "npy: cannot write dtype %d as %d (a float dtype F32, F16, BF16 as any of them; "
              "BOOL as BOOL)",
              (int)t->dtype, (int)as);
    int64_t n;
    MHA_TRY(mha_tensor_numel(t, &n));
    MHA_CHECK(n == 0 || t->data != NULL, MHA_ERR_NULL, "npy: NULL data");
    if (n > 0)
        MHA_TRY(mha_check_extent(t, "npy"));

    /* header, exactly as numpy 1.24 _write_array_header + _wrap_header */
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       as == MHA_F32   ? "<f4"
                       : as == MHA_F16 ? "<f2"
                       : as == MHA_BF16 ? "<u2"
                                        : "|b1");
    for (int k = 0; k < t->ndim; k++)
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%s%lld", k ? ", " : "",
                        (long long)t->shape[k]);
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%s), }", t->ndim == 1 ? "," : "");
    if (t->ndim > 0) { /* GROWTH_AXIS_MAX_DIGITS = 21 spare spaces, less the digits */
        char digits[24];
        int nd = snprintf(digits, sizeof digits, "%lld", (long long)t->shape[0]);
        for (int k = nd; k < 21; k++)
            dict[len++] = ' ';
    }
    int hlen = len + 1;
    int pad = 64 - (10 + hlen) % 64;
    char header[512];
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)((hlen + pad) & 0xff);
    header[9] = (char)((hlen + pad) >> 8);
    memcpy(header + 10, dict, (size_t)len);
    memset(header + 10 + len, ' ', (size_t)pad);
    header[10 + len + pad] = '\n';
    size_t header_bytes = (size_t)(10 + hlen + pad);

    mha_wfile w;
    MHA_TRY(mha_wfile_create(&w, path));
    mha_status st = mha_wfile_write(&w, header, header_bytes);
    size_t es = mha_dtype_size(as);
    uint8_t buf[8192];
    size_t used = 0;
    int64_t idx[MHA_MAX_DIMS] = {0};
    for (int64_t i = 0; st == MHA_OK && i < n; i++) {
        int64_t off = mha_offset(t, idx);
        if (as == MHA_BOOL)
            buf[used] = ((const uint8_t *)t->data)[off] != 0;
        else if (t->dtype == as) /* same representation: the bits as they are */
            memcpy(buf + used, (const uint8_t *)t->data + off * (int64_t)es, es);
        else
            put_float(buf + used, as, mha_load_f(t->data, t->dtype, off));
        used += es;
        if (used + 8 > sizeof buf || i + 1 == n) {
            st = mha_wfile_write(&w, buf, used);
            used = 0;
        }
        for (int k = t->ndim - 1; k >= 0; k--) {
            if (++idx[k] < t->shape[k])
                break;
            idx[k] = 0;
        }
    }
    mha_status fin = mha_wfile_finish(&w, st == MHA_OK);
    return st != MHA_OK ? st : fin;
}
