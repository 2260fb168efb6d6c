/* emu_selftest.c - does the AVX-512 emulation (avx512_emulation.h: SIMDe
 * plus the supplement) compute what Intel's definitions say, on the edge
 * cases the kernels rely on?  SIMDe 0.7.4's roundscale did not (it kept a
 * fraction bit), so the emulated kernels are only as good as this check.
 * Compiled with the emulated kernel files' flags; tests/unit/test_avx512.c
 * calls mha_emu_selftest.  Without SIMDe it reports "not built". */
#include <stddef.h>

int mha_emu_selftest(char *msg, size_t n);

#ifndef MHA_AVX512_EMULATED
int mha_emu_selftest(char *msg, size_t n) {
    (void)msg, (void)n;
    return -1; /* no emulation in this build */
}
#else
#include "simd_avx512.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int fail(char *msg, size_t n, const char *what, int lane, float got, float want) {
    snprintf(msg, n, "%s: lane %d gives %.9g, Intel's definition %.9g", what, lane, got, want);
    return 1;
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

int mha_emu_selftest(char *msg, size_t n) {
    float x[16], y[16], r[16];
    const float nan = NAN, inf = INFINITY;
    const float xs[16] = {-2.5f, -2.26f, -1.5f, -0.5f, -0.0f, 0.0f, 0.5f, 1.5f,
                          2.5f,  3.7f,  -3.7f, nan,   inf,  -inf, 1e-40f, 8388609.0f};
    memcpy(x, xs, sizeof x);
    for (int i = 0; i < 16; i++)
        y[i] = (i % 3 == 0) ? nan : (float)(i - 8) * 0.75f;
    const __m512 vx = _mm512_loadu_ps(x), vy = _mm512_loadu_ps(y);
    /* max/min: when either operand is NaN the SECOND operand is returned */
    _mm512_storeu_ps(r, _mm512_max_ps(vx, vy));
    for (int i = 0; i < 16; i++) {
        const float w = (isnan(x[i]) || isnan(y[i])) ? y[i] : (x[i] > y[i] ? x[i] : y[i]);
        if (!same(r[i], w) && !(x[i] == 0 && y[i] == 0))
            return fail(msg, n, "_mm512_max_ps", i, r[i], w);
    }
    _mm512_storeu_ps(r, _mm512_min_ps(vx, vy));
    for (int i = 0; i < 16; i++) {
        const float w = (isnan(x[i]) || isnan(y[i])) ? y[i] : (x[i] < y[i] ? x[i] : y[i]);
        if (!same(r[i], w) && !(x[i] == 0 && y[i] == 0))
            return fail(msg, n, "_mm512_min_ps", i, r[i], w);
    }
    /* roundscale M = 0: nearest even / floor / ceil / trunc */
    const int modes[4] = {_MM_FROUND_TO_NEAREST_INT, _MM_FROUND_TO_NEG_INF, _MM_FROUND_TO_POS_INF,
                          _MM_FROUND_TO_ZERO};
    for (int m = 0; m < 4; m++) {
        __m512 v;
        switch (m) {
        case 0: v = _mm512_roundscale_ps(vx, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); break;
        case 1: v = _mm512_roundscale_ps(vx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); break;
        case 2: v = _mm512_roundscale_ps(vx, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); break;
        default: v = _mm512_roundscale_ps(vx, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); break;
        }
        _mm512_storeu_ps(r, v);
        for (int i = 0; i < 16; i++) {
            const float f = x[i];
            const float w = m == 1 ? floorf(f) : m == 2 ? ceilf(f) : m == 3 ? truncf(f)
                          : (fabsf(f - truncf(f)) == 0.5f ? 2.0f * roundf(f / 2.0f) : roundf(f));
            if (!same(r[i], w))
                return fail(msg, n, "_mm512_roundscale_ps", i + 100 * modes[m], r[i], w);
        }
    }
    /* reduce M = 0 rounding down: x - floor(x) with the subtraction rounded
     * down (an integer gives -0, a tiny negative value 1 - 2^-24), +0 for
     * +-inf, NaN kept; the bits as Zen 4 gives them */
    const float xr[16] = {-2.5f, -2.26f, -1.5f, -0.5f, -0.0f, 0.0f, 3.0f, -3.0f,
                          2.75f, -1e-30f, -126.0f, nan, inf, -inf, 1e-40f, 8388609.0f};
    const float wr[16] = {0.5f, 0.74f, 0.5f, 0.5f, -0.0f, -0.0f, -0.0f, -0.0f,
                          0.75f, 1.0f - 0x1p-24f, -0.0f, nan, 0.0f, 0.0f, 1e-40f, -0.0f};
    _mm512_storeu_ps(r, _mm512_reduce_ps(_mm512_loadu_ps(xr), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    for (int i = 0; i < 16; i++) {
        const float w = i == 1 ? xr[1] - floorf(xr[1]) : wr[i];
        if (!same(r[i], w))
            return fail(msg, n, "_mm512_reduce_ps", i, r[i], w);
    }
    /* scalef: a * 2^floor(b) for finite b */
    for (int i = 0; i < 16; i++)
        y[i] = (float)(i - 8) + 0.25f * (float)(i % 4);
    _mm512_storeu_ps(r, _mm512_scalef_ps(_mm512_set1_ps(1.5f), _mm512_loadu_ps(y)));
    for (int i = 0; i < 16; i++)
        if (!same(r[i], ldexpf(1.5f, (int)floorf(y[i]))))
            return fail(msg, n, "_mm512_scalef_ps", i, r[i], ldexpf(1.5f, (int)floorf(y[i])));
    /* compare predicates on NaN */
    const __mmask16 unord = _mm512_cmp_ps_mask(vx, vx, _CMP_UNORD_Q);
    const __mmask16 eq = _mm512_cmp_ps_mask(vx, _mm512_set1_ps(-inf), _CMP_EQ_OQ);
    const __mmask16 lt = _mm512_cmp_ps_mask(vx, _mm512_setzero_ps(), _CMP_LT_OQ);
    for (int i = 0; i < 16; i++) {
        if (((unord >> i) & 1) != (isnan(x[i]) ? 1 : 0))
            return fail(msg, n, "_mm512_cmp_ps_mask UNORD_Q", i, (float)((unord >> i) & 1), 0);
        if (((eq >> i) & 1) != (x[i] == -inf ? 1 : 0))
            return fail(msg, n, "_mm512_cmp_ps_mask EQ_OQ", i, (float)((eq >> i) & 1), 0);
        if (((lt >> i) & 1) != (x[i] < 0.0f ? 1 : 0))
            return fail(msg, n, "_mm512_cmp_ps_mask LT_OQ", i, (float)((lt >> i) & 1), 0);
    }
    /* fmadd rounds once: (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly */
    _mm512_storeu_ps(r, _mm512_fmadd_ps(_mm512_set1_ps(1.0f + 0x1p-23f),
                                        _mm512_set1_ps(1.0f - 0x1p-23f), _mm512_set1_ps(-1.0f)));
    if (r[7] != -0x1p-46f)
        return fail(msg, n, "_mm512_fmadd_ps (single rounding)", 7, r[7], -0x1p-46f);
    /* bf16 pairs: cvtne2ps_pbh(a, b) puts b in the low 16 lanes; dpbf16
     * adds the pair products of each 32-bit lane */
    float a16[16], b16[16];
    for (int i = 0; i < 16; i++)
        a16[i] = 1.0f + (float)i, b16[i] = -0.5f * (float)i;
    const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a16), _mm512_loadu_ps(b16));
    uint16_t h[32];
    memcpy(h, &p, sizeof h);
    for (int i = 0; i < 16; i++) {
        uint32_t ub, ua;
        memcpy(&ub, &b16[i], 4), memcpy(&ua, &a16[i], 4);
        if (h[i] != (uint16_t)(ub >> 16) || h[16 + i] != (uint16_t)(ua >> 16))
            return fail(msg, n, "_mm512_cvtne2ps_pbh lane order", i, (float)h[i], b16[i]);
    }
    _mm512_storeu_ps(r, _mm512_dpbf16_ps(_mm512_set1_ps(0.25f), p, p));
    for (int i = 0; i < 16; i++) {
        /* lane i holds bf16 elements 2i, 2i+1: from b16 for i < 8, a16 above */
        const float *src = i < 8 ? b16 : a16;
        const int e = (2 * i) % 16;
        const float w = 0.25f + src[e] * src[e] + src[e + 1] * src[e + 1];
        if (fabsf(r[i] - w) > 1e-6f * fabsf(w))
            return fail(msg, n, "_mm512_dpbf16_ps", i, r[i], w);
    }
    snprintf(msg, n, "ok");
    return 0;
}
#endif
