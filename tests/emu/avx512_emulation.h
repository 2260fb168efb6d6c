/* avx512_emulation.h - AVX-512 intrinsics on an AVX2 machine, for tests.
 *
 * The test library compiles each AVX-512 kernel file (src/kernels/, named
 * _avx512.c) a second time, as _avx512_emu.o, with -DMHA_AVX512_EMULATED and this header: SIMDe (SIMD
 * Everywhere, libsimde-dev) maps the _mm512_* names to portable code, and
 * the intrinsics SIMDe 0.7 lacks are written below from Intel's pseudocode.
 * With MHA_TEST_AVX512=emulate the avx512 kernel choice runs these objects,
 * so the parity suites check the AVX-512 kernels' logic (blocking, tails,
 * masks, bf16 pairs) on machines without AVX-512.  What emulation cannot
 * check - the instruction encodings and fault suppression of masked loads -
 * only a native run checks, which the same suites do on an AVX-512 CPU.
 * The masked loads and stores below touch only the selected lanes, so
 * AddressSanitizer sees an out-of-bounds lane as the native kernel would
 * fault on it (minus suppression, which the kernels must not rely on).
 */
#ifndef MHA_TESTS_AVX512_EMULATION_H
#define MHA_TESTS_AVX512_EMULATION_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The supplement works on lane arrays; a union views a vector as lanes. */
typedef union { simde__m512 v; float f[16]; } emu_ps;
typedef union { simde__m512i v; int32_t i[16]; uint32_t u[16]; uint16_t h[32]; } emu_si;
typedef union { simde__m512bh v; uint16_t h[32]; } emu_bh;
typedef union { simde__m256i v; uint16_t h[16]; } emu_si256;
typedef union { simde__m256bh v; uint16_t h[16]; } emu_bh256;

static inline simde__m512 emu_maskz_loadu_ps(uint16_t k, const void *p) {
    emu_ps r;
    for (int i = 0; i < 16; i++)
        r.f[i] = (k >> i & 1) ? ((const float *)p)[i] : 0.0f;
    return r.v;
}
static inline simde__m512 emu_mask_loadu_ps(simde__m512 src, uint16_t k, const void *p) {
    emu_ps r = {.v = src};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            r.f[i] = ((const float *)p)[i];
    return r.v;
}
static inline void emu_mask_storeu_ps(void *p, uint16_t k, simde__m512 a) {
    emu_ps x = {.v = a};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            ((float *)p)[i] = x.f[i];
}
static inline simde__m256i emu_maskz_loadu_epi16(uint16_t k, const void *p) {
    emu_si256 r;
    for (int i = 0; i < 16; i++)
        r.h[i] = (k >> i & 1) ? ((const uint16_t *)p)[i] : 0;
    return r.v;
}
static inline simde__m512i emu_maskz_loadu_epi32(uint16_t k, const void *p) {
    emu_si r;
    for (int i = 0; i < 16; i++)
        r.u[i] = (k >> i & 1) ? ((const uint32_t *)p)[i] : 0;
    return r.v;
}
static inline simde__m512i emu_maskz_loadu_epi16_512(uint32_t k, const void *p) {
    emu_si r;
    for (int i = 0; i < 32; i++)
        r.h[i] = (k >> i & 1) ? ((const uint16_t *)p)[i] : 0;
    return r.v;
}
static inline void emu_mask_storeu_epi16_256(void *p, uint16_t k, simde__m256i a) {
    emu_si256 x = {.v = a};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            ((uint16_t *)p)[i] = x.h[i];
}
static inline float emu_reduce_add_ps(simde__m512 a) {
    /* the same tree as GCC's _mm512_reduce_add_ps: halves, then quarters */
    emu_ps x = {.v = a};
    float h8[8], h4[4], h2[2];
    for (int i = 0; i < 8; i++)
        h8[i] = x.f[i] + x.f[i + 8];
    for (int i = 0; i < 4; i++)
        h4[i] = h8[i] + h8[i + 4];
    for (int i = 0; i < 2; i++)
        h2[i] = h4[i] + h4[i + 2];
    return h2[0] + h2[1];
}
static inline float emu_reduce_max_ps(simde__m512 a) {
    emu_ps x = {.v = a};
    float m = x.f[0];
    for (int i = 1; i < 16; i++)
        m = x.f[i] > m ? x.f[i] : m;
    return m;
}
/* float -> bf16, round to nearest even, NaN quieted (VCVTNE2PS2BF16). */
static inline uint16_t emu_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* lanes 0..15 from b, 16..31 from a, as the instruction defines */
static inline simde__m512bh emu_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
    emu_ps xa = {.v = a}, xb = {.v = b};
    emu_bh r;
    for (int i = 0; i < 16; i++)
        r.h[i] = emu_bf16(xb.f[i]), r.h[i + 16] = emu_bf16(xa.f[i]);
    return r.v;
}
static inline simde__m256bh emu_cvtneps_pbh(simde__m512 a) {
    emu_ps x = {.v = a};
    emu_bh256 r;
    for (int i = 0; i < 16; i++)
        r.h[i] = emu_bf16(x.f[i]);
    return r.v;
}
static inline simde__m512 emu_cvtph_ps(simde__m256i a) {
    emu_si256 x = {.v = a};
    emu_ps r;
    simde__m128i lo, hi;
    memcpy(&lo, x.h, 16), memcpy(&hi, x.h + 8, 16);
    simde__m256 l = simde_mm256_cvtph_ps(lo), h = simde_mm256_cvtph_ps(hi);
    memcpy(r.f, &l, 32), memcpy(r.f + 8, &h, 32);
    return r.v;
}
static inline simde__m256i emu_cvtps_ph(simde__m512 a, int rounding) {
    emu_ps x = {.v = a};
    simde__m256 l, h;
    memcpy(&l, x.f, 32), memcpy(&h, x.f + 8, 32);
    simde__m128i lo = simde_mm256_cvtps_ph(l, 0), hi = simde_mm256_cvtps_ph(h, 0);
    (void)rounding; /* the kernels pass _MM_FROUND_TO_NEAREST_INT, F16C's 0 */
    emu_si256 r;
    memcpy(r.h, &lo, 16), memcpy(r.h + 8, &hi, 16);
    return r.v;
}
/* vpmovdw: the low 16 bits of each 32-bit lane (truncation) */
static inline simde__m256i emu_cvtepi32_epi16(simde__m512i a) {
    emu_si x = {.v = a};
    emu_si256 r;
    for (int i = 0; i < 16; i++)
        r.h[i] = (uint16_t)x.u[i];
    return r.v;
}
static inline simde__m512i emu_cvtepu16_epi32(simde__m256i a) {
    emu_si256 x = {.v = a};
    emu_si r;
    for (int i = 0; i < 16; i++)
        r.i[i] = x.h[i];
    return r.v;
}

/* The aligned forms fault natively on an address not 64-byte aligned;
 * SIMDe's would not, so the emulation traps instead (a test then crashes
 * loudly rather than passing code that faults on an AVX-512 CPU). */
static inline const void *emu_aligned64(const void *p) {
    if ((uintptr_t)p & 63u)
        __builtin_trap();
    return p;
}
#undef _mm512_load_ps
#define _mm512_load_ps(p) simde_mm512_load_ps(emu_aligned64(p))
#undef _mm512_store_ps
#define _mm512_store_ps(p, a) simde_mm512_store_ps((void *)emu_aligned64(p), (a))
#undef _mm512_load_si512
#define _mm512_load_si512(p) simde_mm512_load_si512(emu_aligned64(p))
#undef _mm512_store_si512
#define _mm512_store_si512(p, a) simde_mm512_store_si512((void *)emu_aligned64(p), (a))
#undef _mm512_stream_ps
#define _mm512_stream_ps(p, a) simde_mm512_store_ps((void *)emu_aligned64(p), (a))

/* VRNDSCALEPS with M = 0 (round to an integer; the only form the kernels
 * use): SIMDe 0.7.4's macro reads imm8 unparenthesised ((imm8 >> 4) & 15 of
 * `_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC`), so it kept a fraction bit
 * (floor to a multiple of 0.5). */
static inline simde__m512 emu_roundscale_ps(simde__m512 a, int imm) {
    if (imm >> 4)
        __builtin_trap(); /* M > 0: not emulated */
    emu_ps x = {.v = a};
    for (int i = 0; i < 16; i++) {
        const float f = x.f[i];
        switch (imm & 4 ? 0 : imm & 3) { /* bit 2: MXCSR's mode (the kernels never ask) */
        case 0: { /* to nearest even, whatever the current rounding mode */
            float r = __builtin_floorf(f);
            const float frac = f - r; /* exact */
            if (frac > 0.5f || (frac == 0.5f && __builtin_fmodf(r, 2.0f) != 0.0f))
                r += 1.0f;
            x.f[i] = __builtin_copysignf(r, f); /* -0.5 rounds to -0 */
            break;
        }
        case 1: x.f[i] = __builtin_floorf(f); break;
        case 2: x.f[i] = __builtin_ceilf(f); break;
        default: x.f[i] = __builtin_truncf(f); break;
        }
    }
    return x.v;
}
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps(a, imm) emu_roundscale_ps((a), (imm))

/* VREDUCEPS with M = 0 fraction bits, rounding down (the only form the
 * kernels use): x - floor(x), the subtraction itself rounded down, so an
 * integer gives -0, a tiny negative x 1 - 2^-24 (checked against Zen 4);
 * +-inf gives +0 (SDM, VREDUCEPS special cases), NaN stays NaN. */
static inline simde__m512 emu_reduce_ps(simde__m512 a, int imm) {
    if ((imm & ~8) != 1)
        __builtin_trap(); /* other forms: not emulated */
    emu_ps x = {.v = a};
    for (int i = 0; i < 16; i++) {
        const float f = x.f[i];
        if (isnan(f) || isinf(f)) {
            x.f[i] = isnan(f) ? f : 0.0f;
            continue;
        }
        /* r: one of the two floats around f - floor(f) (monotone roundings);
         * r + floor(f) and f are exact in double (their bits span < 53), so
         * the comparison picks the lower one */
        const double fl = floor((double)f);
        float r = (float)((double)f - fl);
        if ((double)r + fl > (double)f)
            r = nextafterf(r, -INFINITY);
        x.f[i] = r == 0.0f ? -0.0f : r;
    }
    return x.v;
}
#undef _mm512_reduce_ps
#define _mm512_reduce_ps(a, imm) emu_reduce_ps((a), (imm))

#undef _mm512_mask_cmp_ps_mask
#define _mm512_mask_cmp_ps_mask(k, a, b, p)                                                   \
    ((simde__mmask16)((k) & simde_mm512_cmp_ps_mask((a), (b), (p))))
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, p) emu_maskz_loadu_ps((k), (p))
#undef _mm512_mask_loadu_ps
#define _mm512_mask_loadu_ps(s, k, p) emu_mask_loadu_ps((s), (k), (p))
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(p, k, a) emu_mask_storeu_ps((p), (k), (a))
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16(k, p) emu_maskz_loadu_epi16((k), (p))
#undef _mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi32(k, p) emu_maskz_loadu_epi32((k), (p))
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16(k, p) emu_maskz_loadu_epi16_512((k), (p))
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16(p, k, a) emu_mask_storeu_epi16_256((p), (k), (a))
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps(a) emu_reduce_add_ps(a)
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps(a) emu_reduce_max_ps(a)
#undef _mm512_cvtne2ps_pbh
#define _mm512_cvtne2ps_pbh(a, b) emu_cvtne2ps_pbh((a), (b))
#undef _mm512_cvtneps_pbh
#define _mm512_cvtneps_pbh(a) emu_cvtneps_pbh(a)
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps(a) emu_cvtph_ps(a)
#undef _mm512_cvtps_ph
#define _mm512_cvtps_ph(a, r) emu_cvtps_ph((a), (r))
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32(a) emu_cvtepu16_epi32(a)
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16(a) emu_cvtepi32_epi16(a)

/* ---- for norm_avx512.c: float <-> double conversions, the upper 8 floats,
 * the double sum */
typedef union { simde__m512d v; double d[8]; } emu_pd;
typedef union { simde__m256 v; float f[8]; } emu_ps256;
static inline simde__m512d emu_cvtps_pd(simde__m256 a) {
    emu_ps256 x = {.v = a};
    emu_pd r;
    for (int i = 0; i < 8; i++)
        r.d[i] = (double)x.f[i];
    return r.v;
}
static inline simde__m256 emu_extractf32x8_ps(simde__m512 a, int imm) {
    emu_ps x = {.v = a};
    emu_ps256 r;
    for (int i = 0; i < 8; i++)
        r.f[i] = x.f[(imm & 1) * 8 + i];
    return r.v;
}
static inline simde__m256 emu_cvtpd_ps(simde__m512d a) { /* round to nearest even */
    emu_pd x = {.v = a};
    emu_ps256 r;
    for (int i = 0; i < 8; i++)
        r.f[i] = (float)x.d[i];
    return r.v;
}
static inline double emu_reduce_add_pd(simde__m512d a) {
    /* the same tree as GCC's _mm512_reduce_add_pd: halves, quarters, pair */
    emu_pd x = {.v = a};
    double h4[4], h2[2];
    for (int i = 0; i < 4; i++)
        h4[i] = x.d[i + 4] + x.d[i];
    for (int i = 0; i < 2; i++)
        h2[i] = h4[i + 2] + h4[i];
    return h2[0] + h2[1];
}
#undef _mm512_cvtpd_ps
#define _mm512_cvtpd_ps(a) emu_cvtpd_ps(a)
#undef _mm512_reduce_add_pd
#define _mm512_reduce_add_pd(a) emu_reduce_add_pd(a)
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd(a) emu_cvtps_pd(a)
#undef _mm512_extractf32x8_ps
#define _mm512_extractf32x8_ps(a, imm) emu_extractf32x8_ps((a), (imm))

/* ---- VDPBF16PS (Intel SDM pseudocode): per lane i, two FMAs in float32,
 * the odd pair element first, round to nearest even; denormal inputs read
 * as 0 (DAZ) and denormal results flushed to 0 (FTZ); MXCSR not used. */
static inline float emu_daz(float x) {
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}
static inline float emu_bf16_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return emu_daz(f);
}
static inline simde__m512 emu_dpbf16_ps(simde__m512 src, simde__m512bh a, simde__m512bh b) {
    emu_ps r = {.v = src};
    emu_bh xa = {.v = a}, xb = {.v = b};
    for (int i = 0; i < 16; i++) {
        float acc = emu_daz(r.f[i]);
        acc = emu_daz(fmaf(emu_bf16_float(xa.h[2 * i + 1]), emu_bf16_float(xb.h[2 * i + 1]), acc));
        acc = emu_daz(fmaf(emu_bf16_float(xa.h[2 * i]), emu_bf16_float(xb.h[2 * i]), acc));
        r.f[i] = acc;
    }
    return r.v;
}
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps(src, a, b) emu_dpbf16_ps((src), (a), (b))

/* SIMDe 0.7 has simde_mm512_shuffle_f32x4 but no native alias for it
 * (attention_decode_avx512.c's reduction tree). */
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4((a), (b), (imm8))

#endif /* MHA_TESTS_AVX512_EMULATION_H */
