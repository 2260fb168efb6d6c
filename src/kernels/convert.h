/* convert.h - float32 <-> IEEE half / bfloat16, the one place (private).
 *
 * Scalar conversions (convert.c) used by the file readers and writers and by
 * every kernel that reads or writes a half tensor; the element load/store
 * helpers below let a kernel read q, k, v and write out of any float dtype
 * (MHA_F32, MHA_F16, MHA_BF16) through one code path.  Rounding to half is
 * to nearest even (ref: IEEE 754-2008 §4.3.1); NaN payloads are kept quiet.
 */
#ifndef MHA_KERNELS_CONVERT_H
#define MHA_KERNELS_CONVERT_H

#include "../../include/mha.h"

#include <stdint.h>
#include <string.h>

float mha_half_to_float(uint16_t h);
uint16_t mha_float_to_half(float f);

static inline float mha_bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; NaN stays a quiet NaN with its top payload bits;
 * values past the largest bfloat16 become inf (as the carry says). */
static inline uint16_t mha_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* True for the float dtypes the attention kernels take. */
static inline int mha_dtype_is_float(mha_dtype dt) {
    return dt == MHA_F32 || dt == MHA_F16 || dt == MHA_BF16;
}

/* Element `off` (in elements) of a float tensor's data. */
static inline float mha_load_f(const void *data, mha_dtype dt, int64_t off) {
    switch (dt) {
    case MHA_F16: return mha_half_to_float(((const uint16_t *)data)[off]);
    case MHA_BF16: return mha_bf16_to_float(((const uint16_t *)data)[off]);
    default: return ((const float *)data)[off];
    }
}

static inline void mha_store_f(void *data, mha_dtype dt, int64_t off, float x) {
    switch (dt) {
    case MHA_F16: ((uint16_t *)data)[off] = mha_float_to_half(x); break;
    case MHA_BF16: ((uint16_t *)data)[off] = mha_float_to_bf16(x); break;
    default: ((float *)data)[off] = x; break;
    }
}

/* x rounded to dt and back (the value a half tensor would hold); x itself
 * for MHA_F32. */
static inline float mha_round_to(mha_dtype dt, float x) {
    switch (dt) {
    case MHA_F16: return mha_half_to_float(mha_float_to_half(x));
    case MHA_BF16: return mha_bf16_to_float(mha_float_to_bf16(x));
    default: return x;
    }
}

/* dst[i * dstep] = mul * element (off + i * step) of a float tensor's data,
 * i < n: one strided row widened to float32 (the packing loops). */
static inline void mha_gather_f(float *dst, int64_t dstep, const void *data, mha_dtype dt,
                                int64_t off, int64_t step, int64_t n, float mul) {
    const uint16_t *h = (const uint16_t *)data + off;
    const float *f = (const float *)data + off;
    switch (dt) {
    case MHA_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i * dstep] = mha_half_to_float(h[i * step]) * mul;
        break;
    case MHA_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i * dstep] = mha_bf16_to_float(h[i * step]) * mul;
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            dst[i * dstep] = f[i * step] * mul;
        break;
    }
}

/* Element (off + i * step) of a float tensor's data = src[i], i < n,
 * rounded to dt. */
static inline void mha_scatter_f(void *data, mha_dtype dt, int64_t off, int64_t step,
                                 const float *src, int64_t n) {
    if (dt == MHA_F32 && step == 1) { /* the common output row: a copy */
        memcpy((float *)data + off, src, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        mha_store_f(data, dt, off + i * step, src[i]);
}

#endif
