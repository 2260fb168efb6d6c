/* attention_flash.c - fused (flash-style) attention: the driver shared by every
 * ISA, and the portable scalar inner loops.
 *
 * Letter legend: B batch, Hq query heads, Hkv kv heads, L query length,
 * S key length, d head dim of q/k, dv head dim of v; tile letters BR, BC,
 * MR, NR, dvp as in attention_flash.h.  Reference: attention_ref.c.
 *
 * ref: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention
 * with IO-Awareness" (NeurIPS 2022), Algorithm 1; Milakov & Gimelshein,
 * "Online normalizer calculation for softmax" (2018).
 *
 * Per work item (b, h, tile of BR query rows) and per block of BC keys:
 *   1. S = Q K^T by register blocks of MR x NR over packed K panels; under
 *      causal masking only the panels some row of the block can see;
 *   2. per row: scale, bias (masks, key padding, causal), -inf where masked;
 *      m' = max(m, max_j s) (NaN poisons), rescale O and l by exp(m - m')
 *      only when the maximum changed; p = exp(s - m'), l += sum p (before
 *      dropout), then dropout on p (same keep test as the reference);
 *   3. O += P V over packed V panels.
 * Finally O / l, or the masked-row policy when no key was ever visible.
 * Masked columns carry p = -0.0f; when a V block holds a non-finite value
 * the P V product of that block takes a loop that skips them, so NaN/Inf in
 * masked keys or values never reach the output.  The L x S matrix is never
 * built; with weights requested a second pass recomputes S per block with the
 * final m and l and writes weights directly.
 *
 * Threads: K and V are packed per (b, kv head) once, by a static split of
 * (pair, block) tasks, then items (pair, head in group, query tile) run with
 * a dynamic schedule.  Every item is computed by the same code whichever
 * thread takes it, so the output is bit-identical for any thread count.
 */
#include "attention_flash.h"
#include "attention_bias.h"
#include "attention_short.h"
#include "convert.h"

#include <math.h>
#include <string.h>
#include <time.h>


enum { MR = MHA_FLASH_MR, NR = MHA_FLASH_NR, BR = MHA_FLASH_BR, BC = MHA_FLASH_BC };

/* Packed K/V of a group of (b, kv head) pairs is capped near this size (one
 * pair at least, and enough pairs for mha_chunk_items_wanted work items),
 * and the problem is processed in chunks of pairs: the
 * workspace stays small and the packed blocks are read back from L2/L3
 * soon after they are written.  Measured on an AMX Xeon (2 MiB L2, 2
 * threads, medians of 9 calls): 1 MiB against the former 64 MiB took B32
 * H12 L128 d32 from 7.7 to 5.0 ms (f32; bf16 4.1 -> 2.8), B8 H8 L512 d64
 * from 18.8 to 15.7 ms, B1 H8 L2048 d64 from 28.0 to 26.8 ms; 256 KiB,
 * 512 KiB and 2 MiB were no better.  No result depends on the chunk. */
#define PACK_BUDGET_BYTES ((size_t)1 << 20)

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }
static bool is_masked_mark(float x) { return x == 0.0f && signbit(x); }

/* The three per-row loops of the driver, written so the compiler vectorises
 * them (scalar loops here took 8-10 % of a B=8, L=512, d=64 forward):
 * whether x[0, n) holds no Inf or NaN (exponent bits all ones); x[c] *= a;
 * x[c] /= l (a true division: the reference's rounding). */
static bool all_finite(const float *x, int64_t n) {
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t c = 0; c < n; c++) {
        uint32_t u;
        memcpy(&u, x + c, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

static void scale_row(float *x, int64_t n, float a) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        x[c] *= a;
}

static void divide_row(float *x, int64_t n, float l) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        x[c] /= l;
}

/* ---- portable scalar inner loops ------------------------------------------ */

static void qk_scalar(float *s, int64_t lds, const float *q, int64_t ldq, const float *kp,
                      int64_t d, int64_t npanels) {
    for (int64_t p = 0; p < npanels; p++) {
        const float *k = kp + p * d * NR;
        float acc[MR][NR] = {{0}};
        for (int64_t c = 0; c < d; c++)
            for (int r = 0; r < MR; r++) {
                float a = q[r * ldq + c];
                for (int jj = 0; jj < NR; jj++)
                    acc[r][jj] += a * k[c * NR + jj];
            }
        for (int r = 0; r < MR; r++)
            memcpy(s + r * lds + p * NR, acc[r], sizeof acc[r]);
    }
}

static void pv_scalar(float *o, int64_t ldo, const float *p, int64_t ldp, const float *vp,
                      int64_t n, int64_t dvp) {
    for (int64_t cp = 0; cp < dvp / NR; cp++) {
        const float *v = vp + cp * BC * NR;
        float acc[MR][NR];
        for (int r = 0; r < MR; r++)
            memcpy(acc[r], o + r * ldo + cp * NR, sizeof acc[r]);
        for (int64_t j = 0; j < n; j++)
            for (int r = 0; r < MR; r++) {
                float a = p[r * ldp + j];
                for (int jj = 0; jj < NR; jj++)
                    acc[r][jj] += a * v[j * NR + jj];
            }
        for (int r = 0; r < MR; r++)
            memcpy(o + r * ldo + cp * NR, acc[r], sizeof acc[r]);
    }
}

/* Score epilogue of one row: s[j] = softcap(s[j]*scale) + bias[j] for j <
 * lim (bias -inf stays -inf; cap <= 0: no softcap), -inf up to n; returns
 * the row max, NaN if any score is NaN.  Shared by row_scores_scalar (cap 0,
 * folded away) and row_scores_any's softcap path. */
static inline float row_scores_loop(float *s, int64_t n, int64_t lim, float scale, float cap,
                                    const float *bias) {
    float mx = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < lim; j++) {
        float x = s[j] * scale;
        if (cap > 0.0f)
            x = mha_attn_softcap(x, cap);
        if (bias)
            x = bias[j] == -INFINITY ? -INFINITY : x + bias[j];
        s[j] = x;
        if (isnan(x))
            nan = true;
        else if (x > mx)
            mx = x;
    }
    for (int64_t j = lim; j < n; j++)
        s[j] = -INFINITY;
    return nan ? NAN : mx;
}

static float row_scores_scalar(float *s, int64_t n, int64_t lim, float scale, const float *bias) {
    return row_scores_loop(s, n, lim, scale, 0.0f, bias);
}

static float row_exp_scalar(float *s, int64_t n, float m, mha_dtype pdt) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float e = s[j] == -INFINITY ? -0.0f : mha_softmax_weight(s[j] - m);
        sum += e;
        s[j] = pdt == MHA_F32 ? e : mha_round_to(pdt, e);
    }
    return sum;
}

static void round_row_scalar(float *s, int64_t n, mha_dtype dt) {
    for (int64_t j = 0; j < n; j++)
        s[j] = mha_round_to(dt, s[j]);
}

const mha_flash_isa mha_flash_isa_scalar = {"scalar",          qk_scalar,      pv_scalar,
                                         row_scores_scalar, row_exp_scalar, round_row_scalar,
                                         NULL, NULL, NULL, NULL, NULL};

/* ---- packing ----------------------------------------------------------------- */

typedef struct flash_plan {
    const mha_attn_problem *p;
    const mha_flash_isa *isa;
    const mha_flash_bf16 *dot; /* the bf16 tile products, or NULL          */
    bool bf16_qk;       /* q, k bf16: Q.K^T on pairs (dot->tile_qk)        */
    bool bf16_pv;       /* v bf16: P.V on pairs (dot->tile_pv)             */
    bool tiles;         /* bf16_qk or bf16_pv: whole-tile products run     */
    int64_t d2;         /* ceil(d/2): pairs per packed q or k row          */
    int64_t kblock, vblock; /* floats of one packed K block, V block       */
    int64_t G;          /* query heads per kv head                         */
    int64_t nqb, nkb;   /* query tiles, key blocks                         */
    int64_t dvp;        /* dv rounded up to NR                             */
    int64_t pair_floats;/* packed K and V of one (b, kv head): nkb blocks  */
    bool has_bias;      /* a mask, key padding, window, key lengths or ALiBi */
    bool ext_bias;      /* window, key lengths or ALiBi: mha_attn_bias      */
    float scale;        /* of the product (1 with the ONNX scale: packed in) */
    size_t ws_floats;   /* per-thread workspace                             */
} flash_plan;

/* dst[i * dstep] = mul * element (off + i * stride[3]) of t, i < n: one
 * row of q, k or v widened to float32, by the ISA's vector conversion when
 * the row is a contiguous half row. */
static void load_row(const flash_plan *pl, float *dst, int64_t dstep, const mha_tensor *t,
                     int64_t off, int64_t n, float mul) {
    if (t->dtype == MHA_F32 && t->stride[3] == 1 && dstep == 1 && mul == 1.0f) {
        memcpy(dst, (const float *)t->data + off, sizeof(float) * (size_t)n); /* V rows */
        return;
    }
    if (t->dtype == MHA_F32 || t->stride[3] != 1 || !pl->isa->widen_row) {
        mha_gather_f(dst, dstep, t->data, t->dtype, off, t->stride[3], n, mul);
        return;
    }
    float tmp[256];
    for (int64_t c0 = 0; c0 < n; c0 += 256) {
        const int64_t m = n - c0 < 256 ? n - c0 : 256;
        pl->isa->widen_row(tmp, (const uint16_t *)t->data + off + c0, t->dtype, m);
        for (int64_t c = 0; c < m; c++)
            dst[(c0 + c) * dstep] = tmp[c] * mul;
    }
}

/* The bf16 pair layouts of attention_flash.h, in bf16 elements: element
 * (key j, channel c) of a packed K block (BC/NR, d2, NR) pairs and of a
 * packed V block (dvp/NR, BC/2, NR) pairs. */
static int64_t kpair_at(int64_t d2, int64_t j, int64_t c) {
    return ((j / NR) * d2 * NR + (c / 2) * NR + j % NR) * 2 + c % 2;
}
static int64_t vpair_at(int64_t j, int64_t c) {
    return ((c / NR) * (BC / 2) * NR + (j / 2) * NR + c % NR) * 2 + j % 2;
}

/* Element (j, c) of a packed V block (float32 or pairs), widened. */
static float packed_v(const flash_plan *pl, const float *vp, int64_t j, int64_t c) {
    if (pl->bf16_pv)
        return mha_bf16_to_float(((const uint16_t *)vp)[vpair_at(j, c)]);
    return vp[(c / NR) * BC * NR + j * NR + c % NR];
}

/* Packs key block kb of pair (b, hk) into kp (BC/NR, d, NR) and vp
 * (dvp/NR, BC, NR), or their bf16 pair layouts (bf16_qk, bf16_pv: the bits
 * copied), zero padded; returns true when V holds a non-finite value in the
 * block's real rows. */
static bool pack_kv_block(const flash_plan *pl, int64_t b, int64_t hk, int64_t kb, float *kp,
                          float *vp) {
    const mha_attn_problem *p = pl->p;
    const int64_t d = p->d, dv = p->dv, j0 = kb * BC;
    const int64_t n = p->S - j0 < BC ? p->S - j0 : BC;
    const int64_t k0 = b * p->k.stride[0] + hk * p->k.stride[1];
    const int64_t v0 = b * p->v.stride[0] + hk * p->v.stride[1];
    /* ONNX: k * sqrt(scale), rounded, as the reference */
    const float ks = p->onnx_scale ? p->qk_scale : 1.0f;
    memset(kp, 0, sizeof(float) * (size_t)pl->kblock);
    memset(vp, 0, sizeof(float) * (size_t)pl->vblock);
    bool nonfinite = false;
    /* bf16 V rows, contiguous: two keys at a time by the ISA's pair loop */
    const bool v_pairs = pl->bf16_pv && p->v.stride[3] == 1 && pl->isa->pair_rows;
    for (int64_t j = 0; v_pairs && j < n; j += 2) {
        const uint16_t *a = (const uint16_t *)p->v.data + v0 + (j0 + j) * p->v.stride[2];
        const uint16_t *b2 = j + 1 < n ? a + p->v.stride[2] : NULL;
        nonfinite |= pl->isa->pair_rows((uint32_t *)vp + (j / 2) * NR, (BC / 2) * NR, a, b2, dv);
    }
    /* K panels by the ISA's gathers: float32 elements, or whole bf16 pairs */
    const size_t ke = p->k.dtype == MHA_F32 ? 4 : 2;
    const int64_t krow = p->k.stride[2] * (int64_t)ke;
    const bool k_gather = pl->isa->gather_panel && krow <= INT32_MAX / NR &&
                          (pl->bf16_qk ? p->k.stride[3] == 1 : p->k.dtype == MHA_F32);
    for (int64_t j = 0; k_gather && j < n; j += NR) {
        const char *src = (const char *)p->k.data + (k0 + (j0 + j) * p->k.stride[2]) * (int64_t)ke;
        const int64_t nj = n - j < NR ? n - j : NR;
        if (pl->bf16_qk) {
            uint32_t *dst = (uint32_t *)kp + (j / NR) * pl->d2 * NR;
            pl->isa->gather_panel(dst, src, krow, 4, nj, d / 2, 1.0f);
            for (int64_t jj = 0; d % 2 && jj < nj; jj++) /* odd d: the last half pair */
                dst[(d / 2) * NR + jj] = ((const uint16_t *)src)[jj * p->k.stride[2] + d - 1];
        } else {
            pl->isa->gather_panel((uint32_t *)kp + (j / NR) * d * NR, src, krow,
                                  p->k.stride[3] * 4, nj, d, ks);
        }
    }
    const bool v_spread = !pl->bf16_pv && p->v.dtype == MHA_F32 && p->v.stride[3] == 1 &&
                          pl->isa->spread_row;
    for (int64_t j = 0; j < n; j++) {
        const int64_t kr = k0 + (j0 + j) * p->k.stride[2], vr = v0 + (j0 + j) * p->v.stride[2];
        if (k_gather) {
            /* packed above */
        } else if (pl->bf16_qk) {
            const uint16_t *src = (const uint16_t *)p->k.data + kr;
            for (int64_t c = 0; c < d; c++)
                ((uint16_t *)kp)[kpair_at(pl->d2, j, c)] = src[c * p->k.stride[3]];
        } else {
            load_row(pl, kp + (j / NR) * d * NR + j % NR, NR, &p->k, kr, d, ks);
        }
        if (v_pairs)
            continue;
        if (pl->bf16_pv) {
            const uint16_t *src = (const uint16_t *)p->v.data + vr;
            for (int64_t c = 0; c < dv; c++) {
                const uint16_t x = src[c * p->v.stride[3]];
                ((uint16_t *)vp)[vpair_at(j, c)] = x;
                nonfinite |= (x & 0x7f80u) == 0x7f80u; /* exponent all ones */
            }
            continue;
        }
        float *vd = vp + j * NR;
        if (v_spread) {
            nonfinite |= pl->isa->spread_row(vd, BC * NR, (const float *)p->v.data + vr, dv);
            continue;
        }
        for (int64_t c0 = 0; c0 < dv; c0 += NR) { /* one NR-column panel at a time */
            const int64_t nc = dv - c0 < NR ? dv - c0 : NR;
            float *panel = vd + (c0 / NR) * BC * NR;
            load_row(pl, panel, 1, &p->v, vr + c0 * p->v.stride[3], nc, 1.0f);
            nonfinite |= !all_finite(panel, nc);
        }
    }
    return nonfinite;
}

/* ---- one work item ----------------------------------------------------------- */

typedef struct flash_ws {
    float *qp;   /* (BR, d), or (BR, d2) pairs */
    float *s;    /* (BR, BC)                  */
    float *bias; /* (BR, BC), when has_bias    */
    float *o;    /* (BR, dvp)                 */
    float *m, *l;/* (BR)                      */
    uint16_t *pb;/* (BR, BC) bf16 P for the tile products, when tiles */
    float *rmax; /* (BR) row maxima from dot->tile_qk_max, when tiles */
} flash_ws;

static size_t ws_layout(const flash_plan *pl, float *base, flash_ws *w) {
    const size_t al = 16; /* floats: keep every array on a 64-byte line */
    size_t sizes[8] = {(size_t)(BR * pl->p->d), (size_t)(BR * BC),
                       pl->has_bias ? (size_t)(BR * BC) : 0, (size_t)(BR * pl->dvp), BR, BR,
                       pl->tiles ? (size_t)(BR * BC / 2) : 0, pl->tiles ? (size_t)BR : 0};
    float *at[8];
    size_t off = 0;
    for (int i = 0; i < 8; i++) {
        at[i] = base ? base + off : NULL;
        off += (sizes[i] + al - 1) / al * al;
    }
    w->qp = at[0], w->s = at[1], w->bias = at[2], w->o = at[3], w->m = at[4], w->l = at[5];
    w->pb = (uint16_t *)at[6];
    w->rmax = at[7];
    return off;
}

/* bias (rows, BC) of key block j0..j0+n for query rows i0..: the bias rule
 * of attention_bias.h with the range hoisted out of the key loop (columns
 * past the causal limit are not written); returns false when every entry a
 * row can see is -inf. */
static bool build_bias(const mha_attn_problem *p, bool ext, int64_t b, int64_t h, int64_t i0,
                       int64_t rows, int64_t j0, int64_t n, float *bias) {
    bool live = false;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i = i0 + r;
        int64_t lim = n;
        if (p->causal != MHA_CAUSAL_NONE)
            lim = clamp64(i + mha_attn_offset(p, b) + 1 - j0, 0, n);
        float *br = bias + r * BC;
        int64_t lo = INT64_MIN, hi = INT64_MAX;
        if (ext) /* window, key lengths (ALiBi needs no range) */
            mha_attn_key_range(p, b, i, &lo, &hi);
        for (int64_t j = 0; j < lim; j++) {
            const int64_t jj = j0 + j;
            const float x = jj < lo || jj > hi ? -INFINITY : mha_attn_bias_terms(p, b, h, i, jj);
            br[j] = x;
            live |= x != -INFINITY;
        }
    }
    return live;
}

/* Columns of the block that row group g0.. (rows i0+g0 .. i0+g1-1) may see. */
static int64_t group_cols(const mha_attn_problem *p, int64_t b, int64_t i_last, int64_t j0,
                          int64_t n) {
    if (p->causal == MHA_CAUSAL_NONE)
        return n;
    return clamp64(i_last + mha_attn_offset(p, b) + 1 - j0, 0, n);
}

static int64_t row_lim(const mha_attn_problem *p, int64_t b, int64_t i, int64_t j0, int64_t n) {
    return group_cols(p, b, i, j0, n);
}

/* Row scores with softcap between the scale and the bias (the ISA's
 * row_scores when there is no softcap). */
static float row_scores_any(const flash_plan *pl, float *s, int64_t n, int64_t lim,
                            const float *bias) {
    const float cap = pl->p->softcap;
    if (!(cap > 0.0f))
        return pl->isa->row_scores(s, n, lim, pl->scale, bias);
    return row_scores_loop(s, n, lim, pl->scale, cap, bias);
}

/* Panels per step of the panel-major loops below (block_qk, block_pv): a
 * slice of SLICE panels of K (SLICE*NR keys x d, 16 KiB at d = 64) or of V
 * (BC keys x SLICE*NR columns, 32 KiB; the avx512 block takes 4 panels at
 * once) is read from L2 once per tile and
 * then from L1 by every row group, where a group-major order read the whole
 * block (32-64 KiB at d = 64-128, more than L1 beside the score tile) once
 * per row group.  Each element's sum is the same either way: the order only
 * moves cache traffic, never a bit. */
enum { SLICE = 4 };

/* s (rows, BC) = the q tile . kp^T: on bf16 pairs (bf16_qk) every row to
 * the widest group, else in float32 row group g up to its ncg[g] visible
 * columns, panel-major (see SLICE).  With rmax (bf16_qk, every group seeing
 * the same whole panels) the rows' maxima come with it, where the products
 * have tile_qk_max; returns whether they did. */
static bool block_qk(const flash_plan *pl, const flash_ws *w, int64_t rows, const float *kp,
                     const int64_t *ncg, float *rmax) {
    int64_t most = 0;
    for (int64_t g = 0; g * MR < rows; g++)
        most = ncg[g] > most ? ncg[g] : most;
    if (pl->bf16_qk) {
        const uint32_t *q = (const uint32_t *)w->qp, *k = (const uint32_t *)kp;
        const int64_t np = (most + NR - 1) / NR;
        if (rmax && pl->dot->tile_qk_max) {
            pl->dot->tile_qk_max(w->s, BC, rmax, q, pl->d2, k, pl->d2, np, rows);
            return true;
        }
        pl->dot->tile_qk(w->s, BC, q, pl->d2, k, pl->d2, np, rows);
        return false;
    }
    const int64_t d = pl->p->d;
    for (int64_t p0 = 0; p0 * NR < most; p0 += SLICE)
        for (int64_t g = 0; g * MR < rows; g++) {
            const int64_t np = (ncg[g] + NR - 1) / NR - p0;
            if (np > 0)
                pl->isa->qk(w->s + g * MR * BC + p0 * NR, BC, w->qp + g * MR * d, d,
                            kp + p0 * d * NR, d, np < SLICE ? np : SLICE);
        }
    return false;
}

/* o (rows, dvp) += p (rows, ncg[g] per group) . the packed V block vp: on
 * bf16 pairs (bf16_pv) every row to the widest group, P being w->pb's bf16
 * rows (written by the softmax when in_pb, else converted here from s,
 * exactly: already rounded to bf16); else in float32, panel-major (see
 * SLICE).  Only for a block whose V is finite (the caller skips masked
 * columns otherwise). */
static void block_pv(const flash_plan *pl, const flash_ws *w, int64_t rows, const float *vp,
                     const int64_t *ncg, bool in_pb) {
    const int64_t dvp = pl->dvp;
    if (pl->bf16_pv) { /* zero past each row's own columns */
        int64_t most = 0;
        for (int64_t g = 0; g * MR < rows; g++)
            most = ncg[g] > most ? ncg[g] : most;
        const int64_t n32 = round_up(most, 32), rows16 = round_up(rows, 16);
        for (int64_t r = 0; r < rows16; r++) {
            uint16_t *pr = w->pb + r * BC;
            const int64_t ng = r < rows ? ncg[r / MR] : 0;
            for (int64_t j = 0; !in_pb && j < ng; j++)
                pr[j] = mha_float_to_bf16(w->s[r * BC + j]);
            if (ng < n32) /* full rows (most blocks) need no call */
                memset(pr + ng, 0, sizeof(uint16_t) * (size_t)(n32 - ng));
        }
        pl->dot->tile_pv(w->o, dvp, w->pb, BC, (const uint32_t *)vp, most, dvp, rows);
        return;
    }
    for (int64_t c0 = 0; c0 < dvp; c0 += SLICE * NR) {
        const int64_t nc = dvp - c0 < SLICE * NR ? dvp - c0 : SLICE * NR;
        for (int64_t g = 0; g * MR < rows; g++) {
            const int64_t g0 = g * MR, ng = ncg[g];
            if (ng == 0)
                continue;
            pl->isa->pv(w->o + g0 * dvp + c0, dvp, w->s + g0 * BC, BC, vp + (c0 / NR) * BC * NR,
                        ng, nc);
        }
    }
}

/* S block for rows 0..rows of the tile: fills s, applies the epilogue per
 * row; ncg[g] receives the visible columns of row group g; *fused (when
 * not NULL) whether w->rmax holds the rows' maxima (block_qk: every row sees the whole block
 * and the block is whole panels).  Returns false when the whole block is
 * masked for every row. */
static bool score_block(const flash_plan *pl, const flash_ws *w, int64_t b, int64_t h,
                        int64_t i0, int64_t rows, int64_t kb, const float *kp, int64_t *ncg,
                        bool *fused) {
    const mha_attn_problem *p = pl->p;
    const int64_t j0 = kb * BC, n = p->S - j0 < BC ? p->S - j0 : BC;
    if (pl->has_bias && !build_bias(p, pl->ext_bias, b, h, i0, rows, j0, n, w->bias))
        return false;
    bool any = false, whole = n % NR == 0;
    for (int64_t g0 = 0, g = 0; g0 < rows; g0 += MR, g++) {
        int64_t g1 = g0 + MR < rows ? g0 + MR : rows;
        ncg[g] = group_cols(p, b, i0 + g1 - 1, j0, n);
        any |= ncg[g] > 0;
        whole &= ncg[g] == n;
    }
    const bool got_max = any && block_qk(pl, w, rows, kp, ncg, fused && whole ? w->rmax : NULL);
    if (fused)
        *fused = got_max;
    return any;
}

/* The ONNX qk_matmul_output of modes 0-2 for the tile's rows: the scores of
 * every key, masked ones included (mode 0 scaled, 1 after softcap, 2 plus
 * the bias, -inf where masked). */
static void write_scores(const flash_plan *pl, const flash_ws *w, int64_t b, int64_t h,
                         int64_t i0, int64_t rows, const float *kpack) {
    const mha_attn_problem *p = pl->p;
    float *qt = (float *)p->qk.data + b * p->qk.stride[0] + h * p->qk.stride[1];
    for (int64_t kb = 0; kb < pl->nkb; kb++) {
        const int64_t j0 = kb * BC, n = p->S - j0 < BC ? p->S - j0 : BC;
        int64_t ncg[BR / MR];
        for (int64_t g = 0; g * MR < rows; g++)
            ncg[g] = n;
        block_qk(pl, w, rows, kpack + kb * pl->kblock, ncg, NULL);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) {
                float x = w->s[r * BC + j] * pl->scale;
                if (p->qk_mode >= 1)
                    x = mha_attn_softcap(x, p->softcap);
                if (p->qk_mode == 2) {
                    float bias = mha_attn_bias(p, b, h, i0 + r, j0 + j);
                    x = bias == -INFINITY ? -INFINITY : x + bias;
                }
                qt[(i0 + r) * p->qk.stride[2] + (j0 + j) * p->qk.stride[3]] = x;
            }
    }
}

/* The query tile of rows i0..i0+rows of head (b, h) into w->qp: (BR, d)
 * widened, or (BR, d2) bf16 pairs (bf16_qk); zero rows up to rowsp, a whole
 * register block. */
static void pack_q_tile(const flash_plan *pl, const flash_ws *w, int64_t b, int64_t h,
                        int64_t i0, int64_t rows, int64_t rowsp) {
    const mha_attn_problem *p = pl->p;
    const int64_t d = p->d, q0 = b * p->q.stride[0] + h * p->q.stride[1];
    if (pl->bf16_qk) {
        const int64_t ld = 2 * pl->d2; /* bf16 elements per row */
        uint16_t *qh = (uint16_t *)w->qp;
        for (int64_t r = 0; r < rows; r++) {
            const uint16_t *src = (const uint16_t *)p->q.data + q0 + (i0 + r) * p->q.stride[2];
            if (p->q.stride[3] == 1)
                memcpy(qh + r * ld, src, sizeof(uint16_t) * (size_t)d);
            else
                for (int64_t c = 0; c < d; c++)
                    qh[r * ld + c] = src[c * p->q.stride[3]];
            memset(qh + r * ld + d, 0, sizeof(uint16_t) * (size_t)(ld - d)); /* padding */
        }
        memset(qh + rows * ld, 0, sizeof(uint16_t) * (size_t)((rowsp - rows) * ld));
        return;
    }
    const float qs = p->onnx_scale ? p->qk_scale : 1.0f; /* ONNX: q * sqrt(scale) */
    for (int64_t r = 0; r < rows; r++)
        load_row(pl, w->qp + r * d, 1, &p->q, q0 + (i0 + r) * p->q.stride[2], d, qs);
    memset(w->qp + rows * d, 0, sizeof(float) * (size_t)((rowsp - rows) * d));
}

/* Whether every row of the tile [i0, i0+rows) is plain in the block at j0
 * (the conditions of run_item's per-row `plain`): all rows see the same
 * ncg[0] > 0 columns, no bias or softcap, a finite scale > 0. */
static bool block_is_plain(const flash_plan *pl, int64_t b, int64_t i0, int64_t rows, int64_t j0,
                           const int64_t *ncg) {
    const mha_attn_problem *p = pl->p;
    if (pl->has_bias || p->softcap > 0.0f || !(pl->scale > 0.0f && isfinite(pl->scale)) ||
        ncg[0] == 0)
        return false;
    for (int64_t r = 0; r < rows; r++)
        if (ncg[r / MR] != ncg[0] || row_lim(p, b, i0 + r, j0, ncg[0]) != ncg[0])
            return false;
    return true;
}

static void run_item(const flash_plan *pl, const flash_ws *w, int64_t b, int64_t h, int64_t hk,
                     int64_t qb, const float *pair, const bool *vflags) {
    const mha_attn_problem *p = pl->p;
    const int64_t dv = p->dv, dvp = pl->dvp, i0 = qb * BR;
    const int64_t rows = p->L - i0 < BR ? p->L - i0 : BR, rowsp = round_up(rows, pl->tiles ? 16 : MR);
    const float *kpack = pair, *vpack = pair + pl->nkb * pl->kblock;
    int64_t ncg[BR / MR];

    pack_q_tile(pl, w, b, h, i0, rows, rowsp);
    memset(w->o, 0, sizeof(float) * (size_t)(rowsp * dvp));
    for (int64_t r = 0; r < rows; r++)
        w->m[r] = -INFINITY, w->l[r] = 0.0f;

    /* the last key any row of the tile can see under causal masking */
    int64_t nkb = pl->nkb;
    if (p->causal != MHA_CAUSAL_NONE) {
        int64_t last = i0 + rows - 1 + mha_attn_offset(p, b); /* may be < 0 */
        nkb = last < 0 ? 0 : (last < p->S ? last / BC + 1 : pl->nkb);
    }
    if (p->kv_len.data) { /* keys j >= S_b are masked: skip their blocks */
        int64_t sb = mha_attn_kv_len(p, b);
        int64_t kbl = sb <= 0 ? 0 : (sb < p->S ? (sb + BC - 1) / BC : pl->nkb);
        nkb = kbl < nkb ? kbl : nkb;
    }
    /* the first key any row of the tile can see under a left window */
    int64_t kb0 = 0;
    if (p->window && p->window_left >= 0) {
        int64_t first = i0 + mha_attn_offset(p, b) - p->window_left;
        kb0 = first <= 0 ? 0 : first / BC;
    }
    const float keep = p->dropout ? 1.0f / (1.0f - p->dropout_p) : 1.0f;

    for (int64_t kb = kb0; kb < nkb; kb++) {
        const int64_t j0 = kb * BC;
        bool fused;
        if (!score_block(pl, w, b, h, i0, rows, kb, kpack + kb * pl->kblock, ncg, &fused))
            continue;
        /* P straight into the tile products' bf16 rows: exp and rounding in one pass */
        const bool to_pb = pl->bf16_pv && !p->dropout && !vflags[kb];
        if (to_pb && pl->dot->softmax_rows && block_is_plain(pl, b, i0, rows, j0, ncg)) {
            pl->dot->softmax_rows(w->s, BC, rows, ncg[0], pl->scale, fused ? w->rmax : NULL,
                                  w->m, w->l, w->o, dvp, dvp, w->pb, BC);
            block_pv(pl, w, rows, vpack + kb * pl->vblock, ncg, true);
            continue;
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t ng = ncg[r / MR];
            if (ng == 0)
                continue;
            float *sr = w->s + r * BC;
            const int64_t lim = row_lim(p, b, i0 + r, j0, ng);
            /* plain rows on the tile products: the scale joins the exp pass */
            const bool plain = to_pb && lim == ng && !pl->has_bias && p->softcap <= 0.0f &&
                               pl->scale > 0.0f && isfinite(pl->scale);
            const float *bias = pl->has_bias ? w->bias + r * BC : NULL;
            float mb;
            if (plain) { /* the product's max, or the pass when it saw only NaN */
                mb = fused ? w->rmax[r] : -INFINITY;
                mb = (mb == -INFINITY ? pl->dot->row_max(sr, ng) : mb) * pl->scale;
            } else {
                mb = row_scores_any(pl, sr, ng, lim, bias);
            }
            float mold = w->m[r];
            float mnew = (isnan(mold) || isnan(mb)) ? NAN : (mb > mold ? mb : mold);
            if (mnew == -INFINITY) { /* nothing visible yet: all masked */
                for (int64_t j = 0; j < ng; j++)
                    sr[j] = -0.0f;
                if (to_pb)
                    memset(w->pb + r * BC, 0, sizeof(uint16_t) * (size_t)ng);
                continue;
            }
            if (!(mnew == mold)) {
                if (mold != -INFINITY) { /* lazy rescale: only when the max moved
                                            (0, not a denormal, past a jump of 87:
                                            a denormal O row costs assists) */
                    float alpha = mha_softmax_weight(mold - mnew);
                    scale_row(w->o + r * dvp, dvp, alpha);
                    w->l[r] *= alpha;
                }
                w->m[r] = mnew;
            }
            if (to_pb) {
                w->l[r] += pl->dot->row_exp_bf16(sr, ng, plain ? pl->scale : 1.0f, mnew,
                                                 w->pb + r * BC);
                continue;
            }
            /* P in v's dtype for P.V, as FlashAttention: rounded in the exp
             * pass, or after the dropout */
            w->l[r] += pl->isa->row_exp(sr, ng, mnew, p->dropout ? MHA_F32 : p->p_dtype);
            if (p->dropout) {
                for (int64_t j = 0; j < ng; j++)
                    if (!is_masked_mark(sr[j]))
                        sr[j] = mha_dropout_uniform(p->seed, b, h, i0 + r, j0 + j) < p->dropout_p
                                    ? 0.0f
                                    : sr[j] * keep;
                if (p->p_dtype != MHA_F32)
                    pl->isa->round_row(sr, ng, p->p_dtype);
            }
        }
        const float *vp = vpack + kb * pl->vblock;
        if (!vflags[kb]) {
            block_pv(pl, w, rows, vp, ncg, to_pb);
            continue;
        }
        /* non-finite V in this block: skip masked columns explicitly */
        for (int64_t r = 0; r < rows; r++) {
            const int64_t ng = ncg[r / MR];
            for (int64_t j = 0; j < ng; j++) {
                float pj = w->s[r * BC + j];
                if (is_masked_mark(pj))
                    continue;
                for (int64_t c = 0; c < dv; c++)
                    w->o[r * dvp + c] += pj * packed_v(pl, vp, j, c);
            }
        }
    }

    /* the sink joins the denominator (and the max); then the LSE */
    for (int64_t r = 0; r < rows && p->sinks.data; r++) {
        if (w->m[r] == -INFINITY || isnan(w->m[r]))
            continue; /* dead rows stay dead; NaN stays NaN */
        const float sink = ((const float *)p->sinks.data)[h * p->sinks.stride[0]];
        if (sink > w->m[r]) {
            float alpha = mha_softmax_weight(w->m[r] - sink);
            scale_row(w->o + r * dvp, dvp, alpha);
            w->l[r] *= alpha;
            w->m[r] = sink;
        }
        w->l[r] += expf(sink - w->m[r]);
    }
    if (p->lse.data) {
        float *lse = (float *)p->lse.data + b * p->lse.stride[0] + h * p->lse.stride[1];
        for (int64_t r = 0; r < rows; r++)
            lse[(i0 + r) * p->lse.stride[2]] =
                w->m[r] == -INFINITY ? -INFINITY : w->m[r] + logf(w->l[r]);
    }

    if (p->qk.data && p->qk_mode < 3)
        write_scores(pl, w, b, h, i0, rows, kpack);

    /* write the output rows */
    const int64_t o0 = b * p->o.stride[0] + h * p->o.stride[1];
    const float fill = p->masked_rows == MHA_MASKED_ROWS_NAN ? NAN : 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        float *acc = w->o + r * dvp; /* normalised in place: not read again */
        if (w->m[r] == -INFINITY)
            for (int64_t c = 0; c < dv; c++)
                acc[c] = fill;
        else
            divide_row(acc, dv, w->l[r]);
        const int64_t orow = o0 + (i0 + r) * p->o.stride[2];
        if (p->o.dtype != MHA_F32 && p->o.stride[3] == 1 && pl->isa->narrow_row)
            pl->isa->narrow_row((uint16_t *)p->o.data + orow, acc, dv, p->o.dtype);
        else
            mha_scatter_f(p->o.data, p->o.dtype, orow, p->o.stride[3], acc, dv);
    }
    if (!p->attn_weights.data && !(p->qk.data && p->qk_mode == 3))
        return;

    /* weights (and the ONNX mode-3 qk output, the same numbers): a second
     * pass over the blocks with the final m and l */
    const mha_tensor *wtt = p->attn_weights.data ? &p->attn_weights : &p->qk;
    float *wt = (float *)wtt->data + b * wtt->stride[0] + h * wtt->stride[1];
    const int64_t ws3 = wtt->stride[3];
    float *qt = p->attn_weights.data && p->qk.data && p->qk_mode == 3
                    ? (float *)p->qk.data + b * p->qk.stride[0] + h * p->qk.stride[1]
                    : NULL;
    const int64_t qs2 = qt ? p->qk.stride[2] : 0, qs3 = qt ? p->qk.stride[3] : 0;
    for (int64_t kb = 0; kb < pl->nkb; kb++) {
        const int64_t j0 = kb * BC, n = p->S - j0 < BC ? p->S - j0 : BC;
        bool live = kb < nkb &&
                    score_block(pl, w, b, h, i0, rows, kb, kpack + kb * pl->kblock, ncg, NULL);
        for (int64_t r = 0; r < rows; r++) {
            float *wr = wt + (i0 + r) * wtt->stride[2] + j0 * ws3;
            float *qr = qt ? qt + (i0 + r) * qs2 + j0 * qs3 : NULL;
            const int64_t ng = live ? ncg[r / MR] : 0;
            if (w->m[r] == -INFINITY) {
                for (int64_t j = 0; j < n; j++)
                    wr[j * ws3] = fill;
                for (int64_t j = 0; qr && j < n; j++)
                    qr[j * qs3] = fill;
                continue;
            }
            float *sr = w->s + r * BC;
            if (ng > 0) {
                row_scores_any(pl, sr, ng, row_lim(p, b, i0 + r, j0, ng),
                               pl->has_bias ? w->bias + r * BC : NULL);
                pl->isa->row_exp(sr, ng, w->m[r], MHA_F32);
            }
            for (int64_t j = 0; j < n; j++) {
                float x = j < ng ? sr[j] : -0.0f;
                if (is_masked_mark(x)) {
                    wr[j * ws3] = 0.0f;
                    if (qr)
                        qr[j * qs3] = 0.0f;
                    continue;
                }
                x /= w->l[r];
                if (p->dropout)
                    x = mha_dropout_uniform(p->seed, b, h, i0 + r, j0 + j) < p->dropout_p
                            ? 0.0f
                            : x * keep;
                wr[j * ws3] = x;
                if (qr)
                    qr[j * qs3] = x;
            }
        }
    }
}

/* ---- the driver --------------------------------------------------------------- */

/* The driver's one workspace: packed K/V of `chunk` (b, kv head) pairs (the
 * chunk keeps them near PACK_BUDGET_BYTES in the float32 layout, the
 * largest, so it does not depend on the dtypes and the bound of
 * mha_attn_flash_scratch_bound covers the bf16 pair layouts too), one
 * per-thread tile workspace each, then a flag per packed key block.  false
 * on overflow. */
static bool scratch_sizes(const flash_plan *pl, int nthreads, int64_t *chunk,
                          size_t *pack_floats, size_t *flag_bytes, size_t *total) {
    const mha_attn_problem *p = pl->p;
    const int64_t pairs = p->B * p->Hkv, widest = pl->nkb * BC * (p->d + pl->dvp);
    const size_t pair_bytes = sizeof(float) * (size_t)(widest > 0 ? widest : 1);
    /* enough work items per chunk for the threads (G*nqb per pair; 0 in the
     * scratch bound's plan, which so takes the largest chunk) */
    const int64_t items = pl->G * pl->nqb > 0 ? pl->G * pl->nqb : 1;
    const int64_t want = mha_chunk_items_wanted(nthreads);
    const int64_t budget = (int64_t)(PACK_BUDGET_BYTES / pair_bytes);
    const int64_t least = (want + items - 1) / items;
    *chunk = clamp64(budget > least ? budget : least, 1, pairs > 0 ? pairs : 1);
    size_t ws_all, floats;
    *flag_bytes = (sizeof(bool) * (size_t)(*chunk * pl->nkb + 1) + 63) / 64 * 64;
    return !mha_size_mul_overflows((size_t)*chunk, (size_t)pl->pair_floats, pack_floats) &&
           !mha_size_mul_overflows((size_t)nthreads, pl->ws_floats, &ws_all) &&
           !__builtin_add_overflow(*pack_floats, ws_all, &floats) &&
           !mha_size_mul_overflows(floats, sizeof(float), total) &&
           !__builtin_add_overflow(*total, *flag_bytes, total);
}

/* pl's block sizes: nkb, dvp, d2, kblock, vblock, pair_floats (after
 * bf16_qk and bf16_pv; a bf16 block is at most its float32 size). */
static void plan_blocks(flash_plan *pl) {
    const mha_attn_problem *p = pl->p;
    pl->nkb = (p->S + BC - 1) / BC;
    pl->dvp = round_up(p->dv > 0 ? p->dv : 1, NR);
    pl->d2 = (p->d + 1) / 2;
    if (pl->bf16_qk) /* whole steps of the tile products: zero padded */
        pl->d2 = round_up(pl->d2, pl->dot->d2_align);
    pl->kblock = BC * (pl->bf16_qk ? pl->d2 : p->d);
    pl->vblock = pl->bf16_pv ? BC / 2 * pl->dvp : BC * pl->dvp;
    pl->pair_floats = pl->nkb * (pl->kblock + pl->vblock);
}

mha_status mha_attn_flash_run(const mha_attn_problem *p, const mha_flash_isa *isa,
                              const mha_flash_bf16 *dot) {
    flash_plan pl = {.p = p, .isa = isa, .dot = dot};
    /* ONNX scale: q, k times sqrt(scale) are no bf16 values: widen them */
    pl.bf16_qk = dot && p->q.dtype == MHA_BF16 && p->k.dtype == MHA_BF16 && !p->onnx_scale;
    pl.bf16_pv = dot && p->v.dtype == MHA_BF16 && p->p_dtype == MHA_BF16;
    /* the padded pairs of a tiny d would outgrow the float32 layout the
     * workspace bound plans: those are widened */
    if (dot && round_up((p->d + 1) / 2, dot->d2_align) > p->d)
        pl.bf16_qk = false;
    pl.tiles = pl.bf16_qk || pl.bf16_pv;
    pl.G = p->Hq / p->Hkv;
    pl.nqb = (p->L + BR - 1) / BR;
    plan_blocks(&pl);
    pl.ext_bias = p->window || p->kv_len.data || p->alibi.data;
    pl.has_bias = p->mask.data || p->kpm.data || pl.ext_bias;
    pl.scale = p->onnx_scale ? 1.0f : p->scale;
    pl.ws_floats = ws_layout(&pl, NULL, &(flash_ws){0});

    const int nthreads = mha_threads();
    int64_t chunk;
    size_t pack_floats, flag_bytes, total;
    MHA_CHECK(scratch_sizes(&pl, nthreads, &chunk, &pack_floats, &flag_bytes, &total),
              MHA_ERR_OVERFLOW, "attention: workspace size overflows");
    const bool planned = p->scratch && p->scratch_bytes >= total;
    float *buf = planned ? p->scratch : mha_malloc(total);
    if (!buf)
        return mha_error(MHA_ERR_NOMEM, "attention: cannot allocate %zu bytes of workspace",
                         total);
    bool *vflags = (bool *)((char *)buf + total - flag_bytes);
    const int64_t pairs = p->B * p->Hkv;
    float *pack = buf, *wsbase = buf + pack_floats;

#pragma omp parallel num_threads(nthreads)
    {
        const int tid = mha_thread_index();
        flash_ws w;
        ws_layout(&pl, wsbase + (size_t)tid * pl.ws_floats, &w);
        for (int64_t c0 = 0; c0 < pairs; c0 += chunk) {
            const int64_t np = pairs - c0 < chunk ? pairs - c0 : chunk;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < np * pl.nkb; t++) {
                int64_t pr = t / pl.nkb, kb = t % pl.nkb, pair = c0 + pr;
                float *base = pack + pr * pl.pair_floats;
                vflags[t] = pack_kv_block(&pl, pair / p->Hkv, pair % p->Hkv, kb,
                                          base + kb * pl.kblock,
                                          base + pl.nkb * pl.kblock + kb * pl.vblock);
            }
            /* heavy tiles first: under causal masking the last tiles see most keys */
            const int64_t items = np * pl.G * pl.nqb;
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < items; t++) {
                int64_t qb = pl.nqb - 1 - t % pl.nqb, g = (t / pl.nqb) % pl.G;
                int64_t pr = t / (pl.nqb * pl.G), pair = c0 + pr;
                int64_t b = pair / p->Hkv, hk = pair % p->Hkv;
                if (pl.tiles && dot->tiles_on) /* the tile products run in this item */
                    dot->tiles_on();
                run_item(&pl, &w, b, hk * pl.G + g, hk, qb, pack + pr * pl.pair_floats,
                         vflags + pr * pl.nkb);
                if (pl.tiles && dot->tiles_off)
                    dot->tiles_off();
            }
        }
    }
    if (!planned)
        mha_free(buf);
    return MHA_OK;
}

size_t mha_attn_flash_scratch_bound(int64_t B, int64_t Hkv, int64_t S, int64_t d, int64_t dv,
                                    int nthreads) {
    /* the largest layout: a bias tile, as if some mask were given */
    mha_attn_problem p = {.B = B, .Hkv = Hkv, .Hq = Hkv, .S = S, .d = d, .dv = dv};
    /* the float32 layout, the largest, with the tile products' P rows */
    flash_plan pl = {.p = &p, .has_bias = true, .tiles = true};
    plan_blocks(&pl);
    pl.ws_floats = ws_layout(&pl, NULL, &(flash_ws){0});
    int64_t chunk;
    size_t pack_floats, flag_bytes, total;
    return scratch_sizes(&pl, nthreads, &chunk, &pack_floats, &flag_bytes, &total) ? total : 0;
}

/* ---- kernels and selection ------------------------------------------------ */

mha_status mha_attn_fwd_f32_scalar(const mha_attn_problem *p) {
    return mha_attn_flash_run(p, &mha_flash_isa_scalar, NULL);
}

mha_status mha_attn_fwd_f32_avx2(const mha_attn_problem *p) {
    MHA_CHECK(mha_cpu_has_avx2_fma(), MHA_ERR_UNSUPPORTED,
              "kernel: avx2 requested but this CPU lacks AVX2/FMA");
    if (mha_attn_short_serves(p, MHA_KERNEL_AVX2, false)) /* plain rows that fit: whole rows */
        return mha_attn_short_run(p, MHA_KERNEL_AVX2, false);
    return mha_attn_flash_run(p, &mha_flash_isa_avx2, NULL);
}

mha_status mha_attn_fwd_f32_avx512(const mha_attn_problem *p) {
    MHA_TRY(mha_avx512_check());
    const mha_flash_bf16 *dot = mha_flash_bf16_pick();
    const bool bf16_dots = dot && dot == MHA_AVX512_PICK(mha_flash_bf16_avx512);
    if (mha_attn_short_serves(p, MHA_KERNEL_AVX512, bf16_dots)) /* plain rows that fit */
        return mha_attn_short_run(p, MHA_KERNEL_AVX512, bf16_dots);
    return mha_attn_flash_run(p, MHA_AVX512_PICK(mha_flash_isa_avx512), dot);
}

const mha_flash_bf16 *mha_flash_bf16_pick(void) {
    if (!mha_avx512_emulated() && mha_cpu_has_amx_bf16())
        return &mha_flash_bf16_amx;
    const bool take = mha_avx512_emulated() || mha_cpu_bf16_dot_is_fast();
    return take && mha_avx512_bf16_runs() ? MHA_AVX512_PICK(mha_flash_bf16_avx512) : NULL;
}
