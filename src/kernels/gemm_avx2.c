/* gemm_avx2.c - y (M,N) += x (M,K) w^T with packed panels; and
 * the backward's two products C (M,N) += A (M,K) B (K,N) and
 * C (M,N) += A (K,M)^T B (K,N) through the same kernel (only the packing
 * differs: B (K,N) panels are row copies, A (K,M) is packed transposed).
 * This file holds the driver (packing, loop nest, tails, threads) and the
 * 6x16 AVX2 block; the 12x32 AVX-512 block (gemm_avx512.c) runs in the same
 * driver through mha_gemm_isa (gemm.h).
 *
 * Letters: M rows of x/y, N output features (w is (N,K), PyTorch Linear
 * layout), K input features.  The portable reference of the same product is
 * linear_blocked in src/linear.c; tests/unit/test_gemm.c compares both (and
 * OpenBLAS) with a float64 product.  Compiled with -mavx2 -mfma; reached
 * only after mha_cpu_has_avx2_fma().
 *
 * ref: K. Goto, R. van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication", ACM TOMS 34(3), 2008; F. Van Zee, R. van de Geijn, "BLIS",
 * ACM TOMS 41(3), 2015 (the 5-loop structure and the haswell sgemm 6x16
 * register block).
 *
 *   per task (MC rows x NC columns of y), per KC slice of K and per NR
 *   (16 or 32) columns, NR rows of w are packed into one micro-panel  wp (KC, NR)
 *   (w^T, zero-padded) on the thread's stack, then reused by all MC/MR
 *   row groups of the task; x is read in place (6 row pointers, any ldx),
 *   so nothing is allocated: the layers' planned forward stays
 *   allocation-free whichever path runs;
 *   the 6x16 micro-kernel keeps 12 YMM accumulators, loads 2 YMM of wp and
 *   broadcasts 6 floats of x per k: 12 FMAs per 2 loads + 6 broadcasts;
 *   y = bias + x w^T starts the accumulators of the first KC slice from the
 *   bias row (gemm_ops.set), so y is not filled beforehand.
 *
 * Sizes (fixed, never per thread count):
 *   KC = 256: a wp micro-panel KC x NR is 16 KiB (NR 16) or 32 KiB (NR 32)
 *             and stays in L1 (32-48 KiB) while the task walks down its MC
 *             rows; MR rows of x over KC are 6 or 12 KiB;
 *   MC = 144 (the AVX2 block; mha_gemm_isa.mc): the x block MC x KC (144
 *             KiB) stays in L2 (512 KiB on Zen 1-3) with the y tile MC x NC
 *             (144 KiB at NC = 256) while the task walks its NC / NR
 *             micro-panels; each micro-panel of w is packed once per MC rows
 *             (1 copied float per 288 FLOP);
 *   MC = 576 (the AVX-512 block, whose cores have 1-2 MiB of L2): a 576 KiB
 *             x block, w packed once per 576 rows (1 per 1152 FLOP).  On the
 *             Intel Xeon measured the transposing pack of w had taken 6 % of
 *             an E = 384 MHA forward at MC = 144; `build/gemm_bench avx2 M N
 *             K 5` alternated 3 times, GFLOP/s at MC 144 / 288 / 576: 4096 x
 *             1152 x 384: 93-126 / 114-141 / 135-140; 1024 x 3072 x 1024:
 *             80-122 / 94-139 / 131-141 (noisy host; 576 never lost);
 *   NC = 256: tasks of MC x NC; enough of them for load balance at M >= 300;
 *   AC = 48:  rows of a transposed A (the backward's dW = dY^T X) packed at
 *             a time, 48 KiB on the stack beside the 16-32 KiB B panel; each B
 *             panel is then packed MC / AC times per task (3 at MC = 144, 12 at
 *             576: 1 copied float per 96 FLOP either way).
 * Determinism: every y element is summed in the same order (KC slices in
 * order, k in order inside one, one FMA chain per element) whichever task
 * and thread computes it, so y is bit-identical for any thread count.
 */
#include "gemm.h"
#include "simd_avx2.h" /* transpose8_ps */

#include <immintrin.h>
#include <string.h>

enum { MR = 6, NR = 16, KC = 256, MC = 144, NC = 256 }; /* MR x NR, MC: the AVX2 block's */

/* c (MR, NR) += a (MR, kc) . b (kc, NR), or c = init + a . b with init (NR)
 * non-NULL: a rows are the pointers a0..a5 (any stride, the rows of x), b is
 * a packed panel; c rows ldc apart. */
static void kernel_6x16(int64_t kc, const float *const *a, const float *b, float *c,
                        int64_t ldc, const float *init) {
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    /* rows start from init (stride 0) or from c (stride ldc) */
    const float *c0 = init ? init : c;
    const int64_t lc = init ? 0 : ldc;
    __m256 c00 = _mm256_loadu_ps(c0), c01 = _mm256_loadu_ps(c0 + 8);
    __m256 c10 = _mm256_loadu_ps(c0 + lc), c11 = _mm256_loadu_ps(c0 + lc + 8);
    __m256 c20 = _mm256_loadu_ps(c0 + 2 * lc), c21 = _mm256_loadu_ps(c0 + 2 * lc + 8);
    __m256 c30 = _mm256_loadu_ps(c0 + 3 * lc), c31 = _mm256_loadu_ps(c0 + 3 * lc + 8);
    __m256 c40 = _mm256_loadu_ps(c0 + 4 * lc), c41 = _mm256_loadu_ps(c0 + 4 * lc + 8);
    __m256 c50 = _mm256_loadu_ps(c0 + 5 * lc), c51 = _mm256_loadu_ps(c0 + 5 * lc + 8);
    for (int64_t k = 0; k < kc; k++, b += NR) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), x;
        x = _mm256_broadcast_ss(a0 + k);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + k);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + k);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + k);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4 + k);
        c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5 + k);
        c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01), c += ldc;
    _mm256_storeu_ps(c, c10), _mm256_storeu_ps(c + 8, c11), c += ldc;
    _mm256_storeu_ps(c, c20), _mm256_storeu_ps(c + 8, c21), c += ldc;
    _mm256_storeu_ps(c, c30), _mm256_storeu_ps(c + 8, c31), c += ldc;
    _mm256_storeu_ps(c, c40), _mm256_storeu_ps(c + 8, c41), c += ldc;
    _mm256_storeu_ps(c, c50), _mm256_storeu_ps(c + 8, c51);
}

/* The operands of one product, C (M,N) += op(A) (M,K) op(B) (K,N):
 *   A in place: a (M,K), row i of op(A) is a + i*lda (read by the kernel
 *               through row pointers, any lda);
 *   A packed:   a (K,M), op(A) = a^T; column i of a is gathered into the
 *               packed block ap (see pack_a_block);
 *   B "nk":     b (N,K), op(B) = b^T (PyTorch Linear weight w);
 *   B "kn":     b (K,N), op(B) = b. */
typedef struct gemm_ops {
    const float *a;
    int64_t lda;
    int a_trans; /* 1: a is (K,M), packed */
    const float *b;
    int64_t ldb;
    int b_kn;          /* 1: b is (K,N); 0: b is (N,K) */
    int set;           /* 1: C = bias + op(A) op(B), C's old values unread */
    const float *bias; /* (N) or NULL (zero), when set */
} gemm_ops;

static const float zero_row[MHA_GEMM_NR_MAX] __attribute__((aligned(64)));

/* dst (cols, rows) rows ldd apart = src (rows, cols) rows lds apart,
 * transposed: dst[c*ldd + r] = src[r*lds + c].  8 x 8 tiles in registers
 * (8 row loads, transpose8_ps, 8 row stores), the edges one float at a time.
 * Both packs that transpose (w (N,K) into its panels, a (K,M) into rows)
 * had been the one-float loop alone: its stores, each to another line, took
 * 14 % of the GEMM's time in an E = 512 MHA forward (perf, Intel Xeon). */
static void transpose_into(float *dst, int64_t ldd, const float *src, int64_t lds,
                           int64_t rows, int64_t cols) {
    const int64_t rows8 = rows & ~(int64_t)7, cols8 = cols & ~(int64_t)7;
    for (int64_t r = 0; r < rows8; r += 8)
        for (int64_t c = 0; c < cols8; c += 8) {
            const float *s = src + r * lds + c;
            __m256 t[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                t[i] = _mm256_loadu_ps(s + i * lds);
            transpose8_ps(t);
            float *d = dst + c * ldd + r;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(d + i * ldd, t[i]);
        }
    for (int64_t r = 0; r < rows; r++) /* the edges: columns past cols8, rows past rows8 */
        for (int64_t c = r < rows8 ? cols8 : 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

/* bp (kc, nrp) = op(B) rows [k0, k0+kc), columns [n0, n0+nr) (b already
 * offset to (n0, k0) or (k0, n0)); zero columns past nr; nrp the block's
 * panel width (a multiple of 16). */
static void pack_b_panel(float *bp, const float *b, int64_t ldb, int b_kn, int64_t nr,
                         int64_t nrp, int64_t kc) {
    if (nr < nrp)
        memset(bp, 0, sizeof(float) * (size_t)(kc * nrp));
    if (b_kn && nr == nrp) {
        /* vector moves per row: an inlined memcpy of 64 bytes became
         * `rep movsq`, slow to start, and took most of the packing time */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nrp; j += 16) {
                _mm256_store_ps(bp + k * nrp + j, _mm256_loadu_ps(b + k * ldb + j));
                _mm256_store_ps(bp + k * nrp + j + 8, _mm256_loadu_ps(b + k * ldb + j + 8));
            }
        return;
    }
    if (b_kn) {
        for (int64_t k = 0; k < kc; k++)
            memcpy(bp + k * nrp, b + k * ldb, sizeof(float) * (size_t)nr);
        return;
    }
    transpose_into(bp, nrp, b, ldb, nr, kc);
}

/* ap (mc rows of KC floats) = a^T rows [m0, m0+mc), k [k0, k0+kc) for a
 * (K,M) (a already offset to (k0, m0)): row r of ap is column r of a, so the
 * kernel reads it through row pointers as it reads an in-place a. */
static void pack_a_block(float *ap, const float *a, int64_t lda, int64_t mc, int64_t kc) {
    transpose_into(ap, KC, a, lda, kc, mc);
}

/* One task: C rows [r0, r0+mc) x columns [c0, c0+nc), all of K, on isa's
 * MR x NR block.  The micro-panel of op(B) (16-32 KiB) and, for a
 * transposed A, a block of AC rows of op(A) (48 KiB) live on this thread's
 * stack.  Every C element is summed in the same order (k ascending, one FMA
 * chain) whatever the blocking and the block. */
enum { AC = 48 }; /* rows of op(A) packed at a time: 8 or 4 micro-rows, KC x AC in L2 */

static void gemm_task(const mha_gemm_isa *isa, float *y, int64_t ldy, const gemm_ops *o,
                      int64_t K, int64_t r0, int64_t mc, int64_t c0, int64_t nc) {
    const int64_t mrb = isa->mr, nrb = isa->nr;
    float bp[KC * MHA_GEMM_NR_MAX] __attribute__((aligned(64)));
    float ap[o->a_trans ? AC * KC : 1] __attribute__((aligned(64)));
    float t[MHA_GEMM_MR_MAX * MHA_GEMM_NR_MAX] __attribute__((aligned(64)));
    const int64_t chunk = o->a_trans ? AC : mc;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = K - k0 < KC ? K - k0 : KC;
        for (int64_t i0 = 0; i0 < mc; i0 += chunk) {
            int64_t ic = mc - i0 < chunk ? mc - i0 : chunk;
            if (o->a_trans)
                pack_a_block(ap, o->a + k0 * o->lda + r0 + i0, o->lda, ic, kc);
            for (int64_t j = 0; j < nc; j += nrb) {
                int64_t nr = nc - j < nrb ? nc - j : nrb;
                const float *bsrc = o->b_kn ? o->b + k0 * o->ldb + c0 + j
                                            : o->b + (c0 + j) * o->ldb + k0;
                pack_b_panel(bp, bsrc, o->ldb, o->b_kn, nr, nrb, kc);
                for (int64_t i = i0; i < i0 + ic; i += mrb) {
                    int64_t mr = i0 + ic - i < mrb ? i0 + ic - i : mrb;
                    const float *a[MHA_GEMM_MR_MAX];
                    /* rows past mr repeat the first row; their results are dropped */
                    for (int64_t r = 0; r < mrb; r++) {
                        int64_t row = i + (r < mr ? r : 0);
                        a[r] = o->a_trans ? ap + (row - i0) * KC
                                          : o->a + (r0 + row) * o->lda + k0;
                    }
                    float *c = y + (r0 + i) * ldy + c0 + j;
                    /* the first k slice of a set product starts from the bias */
                    const float *init = NULL;
                    if (o->set && k0 == 0)
                        init = o->bias ? o->bias + c0 + j : zero_row;
                    if (mr == mrb && nr == nrb) {
                        isa->block(kc, a, bp, c, ldy, init);
                    } else {
                        /* partial block through a full tile: the arithmetic is the block's own */
                        for (int64_t r = 0; r < mr; r++)
                            memcpy(t + r * nrb, init ? init : c + r * ldy,
                                   sizeof(float) * (size_t)nr);
                        isa->block(kc, a, bp, t, nrb, NULL);
                        for (int64_t r = 0; r < mr; r++)
                            memcpy(c + r * ldy, t + r * nrb, sizeof(float) * (size_t)nr);
                    }
                }
            }
        }
    }
}

/* Tasks of isa->mc x NC, fixed by the problem size (never by the thread count). */
static void gemm_run(const mha_gemm_isa *isa, float *y, int64_t ldy, const gemm_ops *o, int64_t M,
                     int64_t N, int64_t K) {
    if (M <= 0 || N <= 0 || K <= 0)
        return;
    const int64_t rows = isa->mc; /* per task */
    const int64_t nmb = (M + rows - 1) / rows, nnb = (N + NC - 1) / NC, tasks = nmb * nnb;
    int nt = mha_threads();
    if (nt > tasks)
        nt = (int)tasks;
    /* small products are not worth waking threads (results do not depend on it) */
    if ((double)M * (double)N * (double)K < 2.0e6)
        nt = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t mb = t / nnb, nb = t % nnb;
        int64_t r0 = mb * rows, c0 = nb * NC;
        int64_t mc = M - r0 < rows ? M - r0 : rows, nc = N - c0 < NC ? N - c0 : NC;
        gemm_task(isa, y, ldy, o, K, r0, mc, c0, nc);
    }
}

const mha_gemm_isa mha_gemm_isa_avx2 = {MR, NR, MC, kernel_6x16};

const mha_gemm_isa *mha_gemm_isa_pick(void) {
    if (mha_kernel_resolve(MHA_KERNEL_AUTO) == MHA_KERNEL_AVX512 && mha_avx512_runs())
        return MHA_AVX512_PICK(mha_gemm_isa_avx512);
    return &mha_gemm_isa_avx2;
}

void mha_gemm_f32_run(const mha_gemm_isa *isa, float *y, int64_t ldy, const float *x,
                      int64_t ldx, const float *w, int64_t ldw, int64_t M, int64_t N, int64_t K,
                      const float *bias, int set) {
    gemm_ops o = {.a = x, .lda = ldx, .a_trans = 0, .b = w, .ldb = ldw, .b_kn = 0,
                  .set = set != 0, .bias = bias};
    gemm_run(isa, y, ldy, &o, M, N, K);
}

void mha_gemm_f32_ab_run(const mha_gemm_isa *isa, int trans_a, float *c, int64_t ldc,
                         const float *a, int64_t lda, const float *b, int64_t ldb, int64_t M,
                         int64_t N, int64_t K) {
    gemm_ops o = {.a = a, .lda = lda, .a_trans = trans_a != 0, .b = b, .ldb = ldb, .b_kn = 1};
    gemm_run(isa, c, ldc, &o, M, N, K);
}

void mha_gemm_f32_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                       int64_t ldw, int64_t M, int64_t N, int64_t K, const float *bias, int set) {
    mha_gemm_f32_run(mha_gemm_isa_pick(), y, ldy, x, ldx, w, ldw, M, N, K, bias, set);
}

void mha_gemm_f32_ab_avx2(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                          const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K) {
    mha_gemm_f32_ab_run(mha_gemm_isa_pick(), trans_a, c, ldc, a, lda, b, ldb, M, N, K);
}
