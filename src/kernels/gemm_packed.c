/* gemm_packed.c - the packed-weight GEMM's portable half: the packing, the
 * scalar GELU, the reference product that the SIMD blocks must match bit for
 * bit (before GELU), and the loop nest that runs a block (4x24 AVX2,
 * gemm_packed_avx2.c; 8x24 AVX-512, gemm_packed_avx512.c).  Layout and the
 * sum's order: gemm_packed.h.  Letters: M rows, N output features, K input
 * features; MR x NR the block, KC the k slice, MC rows and NP panels per task.
 *
 * ref: K. Goto, R. van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication", ACM TOMS 34(3), 2008 (the loop nest).
 *   per task (MC rows x NP panels), per KC slice, per panel: the block walks
 *   the task's rows MR at a time with the panel's KC x 24 slice (36 KiB,
 *   L1/L2) and x read in place through MR row pointers (any ldx), so nothing
 *   is packed per call and nothing is allocated.
 * Sizes: KC = 384 (one slice for K = 384, four for K = 1536); MC <= 144 rows
 * (x block MC x KC = 216 KiB and the y tile in L2), NP = 16 panels (384
 * columns).  The blocking never changes a bit: every element is one FMA
 * chain in k order (gemm_packed.h), stored and reloaded unchanged between
 * slices.
 */
#include "gemm_packed.h"

#include <math.h>
#include <string.h>

enum { NR = MHA_PACK_NR, KC = 384, MC = 144, NP = 16 };

int64_t mha_gemm_packed_floats(int64_t N, int64_t K) {
    return (N + MHA_PACK_NR - 1) / MHA_PACK_NR * MHA_PACK_NR * K;
}

void mha_gemm_pack(float *wp, const float *w, int64_t ldw, int64_t N, int64_t K) {
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        float *panel = wp + n0 * K; /* panel n0/NR starts at (n0/NR) * K * NR */
        const int64_t nr = N - n0 < NR ? N - n0 : NR;
        if (nr < NR)
            memset(panel, 0, sizeof(float) * (size_t)(K * NR));
        for (int64_t j = 0; j < nr; j++) {
            const float *row = w + (n0 + j) * ldw;
            for (int64_t k = 0; k < K; k++)
                panel[k * NR + j] = row[k];
        }
    }
}

float mha_gelu_as_f32(float x) {
    const float z = x * 0.70710678118654752f, a = fabsf(z);
    const float t = 1.0f / (0.3275911f * a + 1.0f);
    float r = 1.061405429f * t + -1.453152027f;
    r = r * t + 1.421413741f;
    r = r * t + -0.284496736f;
    r = r * t + 0.254829592f;
    const float e = r * t * expf(-(a * a)); /* erfc(|z|) */
    return 0.5f * x * (z < 0.0f ? e : 2.0f - e);
}

/* Obviously correct and slow: one element at a time, its FMA chain in k
 * order exactly as gemm_packed.h states it. */
void mha_gemm_packed_f32_ref(float *y, int64_t ldy, const float *x, int64_t ldx,
                             const float *wp, const float *bias, int64_t M, int64_t N,
                             int64_t K, int accumulate, int gelu) {
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            const float *wcol = wp + n / NR * K * NR + n % NR; /* w[n][k] = wcol[k * NR] */
            float acc = bias ? bias[n] : 0.0f;
            if (accumulate)
                acc = y[m * ldy + n] + acc;
            for (int64_t k = 0; k < K; k++)
                acc = fmaf(x[m * ldx + k], wcol[k * NR], acc);
            y[m * ldy + n] = gelu ? mha_gelu_as_f32(acc) : acc;
        }
    }
}

/* ---- the loop nest around a SIMD block ---------------------------------- */

typedef struct packed_gemm {
    const mha_gemm_packed_isa *isa;
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx;
    const float *wp, *bias;
    int64_t M, N, K;
    int accumulate, gelu;
} packed_gemm;

/* Rows [r0, r0+mc) x panels [p0, p0+np) of y, all of K. */
static void packed_task(const packed_gemm *g, int64_t r0, int64_t mc, int64_t p0, int64_t np) {
    const int MR = g->isa->mr;
    float t[MHA_PACK_MR_MAX * NR] __attribute__((aligned(64))) = {0};
    float bias_pad[NR];
    const int64_t K = g->K;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        const int first = k0 == 0, gelu = g->gelu && k0 + kc == K;
        for (int64_t p = p0; p < p0 + np; p++) {
            const int64_t n0 = p * NR, nr = g->N - n0 < NR ? g->N - n0 : NR;
            const float *b = g->wp + (n0 * K + k0 * NR); /* panel p, row k0 */
            const float *bias = g->bias ? g->bias + n0 : NULL;
            if (!bias || nr < NR) { /* zeros past N (and without bias) */
                memset(bias_pad, 0, sizeof bias_pad);
                if (g->bias)
                    memcpy(bias_pad, g->bias + n0, sizeof(float) * (size_t)nr);
                bias = bias_pad;
            }
            for (int64_t i = 0; i < mc; i += MR) {
                const int64_t mr = mc - i < MR ? mc - i : MR;
                const float *a[MHA_PACK_MR_MAX];
                for (int r = 0; r < MR; r++) /* rows past mr repeat row 0, dropped below */
                    a[r] = g->x + (r0 + i + (r < mr ? r : 0)) * g->ldx + k0;
                float *c = g->y + (r0 + i) * g->ldy + n0;
                if (mr == MR && nr == NR) {
                    g->isa->block(kc, a, b, c, g->ldy, bias, first, g->accumulate, gelu);
                    continue;
                }
                /* a partial block through a full tile: the same arithmetic */
                if (!first || g->accumulate)
                    for (int64_t r = 0; r < mr; r++)
                        memcpy(t + r * NR, c + r * g->ldy, sizeof(float) * (size_t)nr);
                g->isa->block(kc, a, b, t, NR, bias, first, g->accumulate, gelu);
                for (int64_t r = 0; r < mr; r++)
                    memcpy(c + r * g->ldy, t + r * NR, sizeof(float) * (size_t)nr);
            }
        }
    }
}

void mha_gemm_packed_run(const mha_gemm_packed_isa *isa, float *y, int64_t ldy, const float *x,
                         int64_t ldx, const float *wp, const float *bias, int64_t M, int64_t N,
                         int64_t K, int accumulate, int gelu) {
    const int64_t MR = isa->mr;
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* no products: the sum is its start, then GELU */
        mha_gemm_packed_f32_ref(y, ldy, x, ldx, wp, bias, M, N, K, accumulate, gelu);
        return;
    }
    const packed_gemm g = {isa, y, ldy, x, ldx, wp, bias, M, N, K, accumulate != 0, gelu != 0};
    /* tasks of about MC rows (a multiple of MR, evened out over the row
     * blocks) x NP panels; which thread runs which task changes no bit */
    const int64_t P = (N + NR - 1) / NR, npb = (P + NP - 1) / NP, np = (P + npb - 1) / npb;
    const int64_t nmb = (M + MC - 1) / MC;
    const int64_t mc = ((M + nmb - 1) / nmb + MR - 1) / MR * MR;
    const int64_t tasks = nmb * npb;
    int nt = mha_threads();
    if (nt > tasks)
        nt = (int)tasks;
    if ((double)M * (double)N * (double)K < 2.0e6) /* not worth waking threads */
        nt = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t r0 = t / npb * mc, p0 = t % npb * np;
        if (r0 < M)
            packed_task(&g, r0, M - r0 < mc ? M - r0 : mc, p0, P - p0 < np ? P - p0 : np);
    }
}


void mha_gemm_packed_f32_avx2(float *y, int64_t ldy, const float *x, int64_t ldx,
                              const float *wp, const float *bias, int64_t M, int64_t N,
                              int64_t K, int accumulate, int gelu) {
    mha_gemm_packed_run(&mha_gemm_packed_isa_avx2, y, ldy, x, ldx, wp, bias, M, N, K, accumulate,
                        gelu);
}

void mha_gemm_packed_f32_avx512(float *y, int64_t ldy, const float *x, int64_t ldx,
                                const float *wp, const float *bias, int64_t M, int64_t N,
                                int64_t K, int accumulate, int gelu) {
    mha_gemm_packed_run(MHA_AVX512_PICK(mha_gemm_packed_isa_avx512), y, ldy, x, ldx, wp, bias, M,
                        N, K, accumulate, gelu);
}
