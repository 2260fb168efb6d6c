/* tensor.c - tensor views: construction, validation, broadcasting. */
#include "internal.h"
#include "kernels/convert.h"

#include <string.h>

size_t mha_dtype_size(mha_dtype dtype) {
    switch (dtype) {
    case MHA_F32: return 4;
    case MHA_BOOL: return 1;
    case MHA_F16: return 2;
    case MHA_I64: return 8;
    case MHA_BF16: return 2;
    }
    return 0;
}

static const char *dtype_name(mha_dtype dtype) {
    switch (dtype) {
    case MHA_F32: return "float32";
    case MHA_BOOL: return "bool";
    case MHA_F16: return "float16";
    case MHA_I64: return "int64";
    case MHA_BF16: return "bfloat16";
    }
    return "unknown";
}

bool mha_product(const int64_t *sizes, int n, int64_t *r) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (sizes[i] < 0 || mha_mul_overflows(p, sizes[i], &p))
            return false;
    *r = p;
    return true;
}

mha_status mha_tensor_init(mha_tensor *t, mha_dtype dtype, void *data, int ndim,
                           const int64_t *shape) {
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "tensor: NULL view");
    MHA_CHECK(ndim >= 0 && ndim <= MHA_MAX_DIMS, MHA_ERR_SHAPE,
              "tensor: %d dimensions (at most %d)", ndim, MHA_MAX_DIMS);
    MHA_CHECK(ndim == 0 || shape != NULL, MHA_ERR_NULL, "tensor: NULL shape");
    MHA_CHECK(mha_dtype_size(dtype) != 0, MHA_ERR_DTYPE, "tensor: unknown dtype %d", (int)dtype);
    mha_tensor v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dtype;
    v.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        MHA_CHECK(shape[i] >= 0, MHA_ERR_SHAPE, "tensor: negative size %lld in dim %d",
                  (long long)shape[i], i);
        v.shape[i] = shape[i];
        v.stride[i] = stride;
        MHA_CHECK(!mha_mul_overflows(stride, shape[i] > 0 ? shape[i] : 1, &stride),
                  MHA_ERR_OVERFLOW, "tensor: element count overflows");
    }
    int64_t bytes;
    MHA_CHECK(!mha_mul_overflows(stride, (int64_t)mha_dtype_size(dtype), &bytes),
              MHA_ERR_OVERFLOW, "tensor: byte count overflows");
    *t = v;
    return MHA_OK;
}

mha_status mha_tensor_create(mha_tensor *t, mha_dtype dtype, int ndim, const int64_t *shape) {
    MHA_TRY(mha_tensor_init(t, dtype, NULL, ndim, shape));
    int64_t n;
    MHA_TRY(mha_tensor_numel(t, &n));
    size_t bytes = (size_t)n * mha_dtype_size(dtype);
    t->data = mha_calloc(bytes ? bytes : 1, 1);
    if (!t->data) {
        char sb[MHA_SHAPE_BUF];
        return mha_error(MHA_ERR_NOMEM, "tensor: cannot allocate %zu bytes for shape %s", bytes,
                         mha_shape_str(t, sb, sizeof sb));
    }
    return MHA_OK;
}

void mha_tensor_free(mha_tensor *t) {
    if (!t)
        return;
    mha_free(t->data);
    t->data = NULL;
}

mha_status mha_tensor_numel(const mha_tensor *t, int64_t *numel) {
    MHA_CHECK(t != NULL && numel != NULL, MHA_ERR_NULL, "tensor: NULL argument");
    MHA_CHECK(mha_product(t->shape, t->ndim, numel), MHA_ERR_OVERFLOW,
              "tensor: element count overflows");
    return MHA_OK;
}

mha_status mha_check_extent(const mha_tensor *t, const char *name) {
    int64_t last = 0, n;
    for (int i = 0; i < t->ndim; i++) {
        MHA_CHECK(t->shape[i] >= 0, MHA_ERR_SHAPE, "%s: negative size in dim %d", name, i);
        MHA_CHECK(t->stride[i] >= 0, MHA_ERR_SHAPE, "%s: negative stride in dim %d", name, i);
        if (t->shape[i] == 0)
            return MHA_OK; /* empty: touches nothing */
        MHA_CHECK(!mha_mul_overflows(t->shape[i] - 1, t->stride[i], &n) &&
                      !__builtin_add_overflow(last, n, &last),
                  MHA_ERR_OVERFLOW, "%s: extent overflows", name);
    }
    int64_t bytes;
    MHA_CHECK(!mha_mul_overflows(last + 1, (int64_t)mha_dtype_size(t->dtype), &bytes),
              MHA_ERR_OVERFLOW, "%s: byte extent overflows", name);
    return MHA_OK;
}

static bool tensor_empty(const mha_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return true;
    return false;
}

/* The checks every tensor argument gets; dtype_ok and want say which
 * dtypes the caller takes. */
static mha_status check_tensor_as(const mha_tensor *t, const char *name, int ndim, bool dtype_ok,
                                  const char *want) {
    MHA_CHECK(t != NULL, MHA_ERR_NULL, "%s: NULL tensor", name);
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(t->ndim == ndim, MHA_ERR_SHAPE, "%s: expected %d dimensions, got shape %s", name,
              ndim, mha_shape_str(t, sb, sizeof sb));
    MHA_CHECK(dtype_ok, MHA_ERR_DTYPE, "%s: expected %s, got %s", name, want,
              dtype_name(t->dtype));
    MHA_TRY(mha_check_extent(t, name));
    MHA_CHECK(t->data != NULL || tensor_empty(t), MHA_ERR_NULL, "%s: NULL data", name);
    return MHA_OK;
}

mha_status mha_check_tensor(const mha_tensor *t, const char *name, int ndim, mha_dtype dtype) {
    return check_tensor_as(t, name, ndim, t && t->dtype == dtype, dtype_name(dtype));
}

mha_status mha_check_float_tensor(const mha_tensor *t, const char *name, int ndim) {
    return check_tensor_as(t, name, ndim, t && mha_dtype_is_float(t->dtype),
                           "float32, float16 or bfloat16");
}

mha_status mha_check_writable(const mha_tensor *t, const char *name) {
    if (tensor_empty(t))
        return MHA_OK;
    int dims[MHA_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1)
            dims[n++] = i;
    for (int a = 1; a < n; a++) /* insertion sort by stride */
        for (int b = a; b > 0 && t->stride[dims[b]] < t->stride[dims[b - 1]]; b--) {
            int x = dims[b];
            dims[b] = dims[b - 1], dims[b - 1] = x;
        }
    int64_t span = 0; /* largest offset reached by the smaller-stride dims */
    char sb[MHA_SHAPE_BUF];
    for (int a = 0; a < n; a++) {
        int i = dims[a];
        MHA_CHECK(t->stride[i] > span, MHA_ERR_ALIAS,
                  "%s: shape %s with stride %lld in dim %d writes some elements twice "
                  "(an output cannot be a broadcast or self-overlapping view)",
                  name, mha_shape_str(t, sb, sizeof sb), (long long)t->stride[i], i);
        span += (t->shape[i] - 1) * t->stride[i];
    }
    return MHA_OK;
}

/* Byte range [lo, hi) covered by a view. */
static void byte_span(const mha_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++)
        last += (t->shape[i] - 1) * t->stride[i];
    size_t es = mha_dtype_size(t->dtype);
    *lo = (uintptr_t)t->data;
    *hi = *lo + (uintptr_t)(last + 1) * es;
}

bool mha_tensors_overlap(const mha_tensor *a, const mha_tensor *b) {
    if (!a || !b || !a->data || !b->data || tensor_empty(a) || tensor_empty(b))
        return false;
    uintptr_t alo, ahi, blo, bhi;
    byte_span(a, &alo, &ahi);
    byte_span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

bool mha_tensors_same(const mha_tensor *a, const mha_tensor *b) {
    if (a == b)
        return true;
    if (!a || !b || a->data != b->data || a->ndim != b->ndim || a->dtype != b->dtype)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i]))
            return false;
    return true;
}

mha_status mha_broadcast4(const mha_tensor *t, const char *name, const int64_t want[4],
                          mha_tensor *view) {
    char sb[MHA_SHAPE_BUF];
    MHA_CHECK(t->ndim >= 1 && t->ndim <= 4, MHA_ERR_SHAPE,
              "%s: shape %s has %d dimensions (1 to 4 allowed)", name,
              mha_shape_str(t, sb, sizeof sb), t->ndim);
    MHA_CHECK(t->dtype == MHA_F32 || t->dtype == MHA_BOOL, MHA_ERR_DTYPE,
              "%s: masks are bool (boolean) or float32 (additive)", name);
    MHA_TRY(mha_check_extent(t, name));
    mha_tensor v = *t;
    v.ndim = 4;
    int shift = 4 - t->ndim;
    for (int i = 0; i < 4; i++) {
        int64_t size = i < shift ? 1 : t->shape[i - shift];
        int64_t stride = i < shift ? 0 : t->stride[i - shift];
        MHA_CHECK(size == want[i] || size == 1, MHA_ERR_SHAPE,
                  "%s: shape %s does not broadcast to (%lld,%lld,%lld,%lld)", name,
                  mha_shape_str(t, sb, sizeof sb), (long long)want[0], (long long)want[1],
                  (long long)want[2], (long long)want[3]);
        v.shape[i] = want[i];
        v.stride[i] = size == 1 ? 0 : stride;
    }
    bool empty = want[0] == 0 || want[1] == 0 || want[2] == 0 || want[3] == 0;
    MHA_CHECK(v.data != NULL || empty, MHA_ERR_NULL, "%s: NULL data", name);
    *view = v;
    return MHA_OK;
}

/* ---- conversion --------------------------------------------------------- */

mha_status mha_tensor_convert(mha_tensor *dst, const mha_tensor *src) {
    MHA_CHECK(src && dst, MHA_ERR_NULL, "tensor_convert: NULL tensor");
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_float_tensor(src, "src", src->ndim));
    MHA_TRY(mha_check_float_tensor(dst, "dst", src->ndim));
    for (int i = 0; i < src->ndim; i++)
        MHA_CHECK(dst->shape[i] == src->shape[i], MHA_ERR_SHAPE,
                  "dst: shape %s, want src's %s", mha_shape_str(dst, s1, sizeof s1),
                  mha_shape_str(src, s2, sizeof s2));
    MHA_TRY(mha_check_writable(dst, "dst"));
    MHA_CHECK(!mha_tensors_overlap(dst, src), MHA_ERR_ALIAS, "dst: overlaps src");
    int64_t n;
    MHA_TRY(mha_tensor_numel(src, &n));
    int64_t shape[MHA_MAX_DIMS] = {1, 1, 1, 1}, ss[MHA_MAX_DIMS] = {0}, ds[MHA_MAX_DIMS] = {0};
    const int off = MHA_MAX_DIMS - src->ndim; /* right-align into 4 dims */
    for (int i = 0; i < src->ndim; i++)
        shape[off + i] = src->shape[i], ss[off + i] = src->stride[i], ds[off + i] = dst->stride[i];
    for (int64_t a = 0; a < shape[0] && n > 0; a++)
        for (int64_t b = 0; b < shape[1]; b++)
            for (int64_t c = 0; c < shape[2]; c++)
                for (int64_t e = 0; e < shape[3]; e++)
                    mha_store_f(dst->data, dst->dtype, a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3],
                                mha_load_f(src->data, src->dtype,
                                           a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3]));
    return MHA_OK;
}
