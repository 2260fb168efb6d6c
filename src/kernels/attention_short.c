/* attention_short.c - the whole-row attention's workspace size, its
 * reference (the plain loop, one head and one query row at a time), the
 * avx512 dispatch and the driver that serves mha_sdpa_forward's plain
 * problems with it (see attention_short.h).  Letters: L query rows, S keys,
 * H heads, d head width; B batch, Hq query heads, Hkv kv heads. */
#include "attention_short.h"
#include "attention_flash.h" /* the ISAs' widen_row / narrow_row */

#include <math.h>

static int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }

int64_t mha_attn_short_ws_floats(int64_t S, int64_t d) {
    /* avx2: K^T (d, S rounded to 16), V (d rounded to 16, S rounded to 16)
     * and 6 score rows; avx512: K^T (d, S rounded to 32), V (d rounded to
     * 32, S rounded to 32) and 8 score rows; avx512 bf16: K^T pairs (ceil(d/2),
     * S rounded to 32), V pairs (ceil(S/2), d rounded to 32), 8 score rows,
     * 8 bf16 P rows, 8 q rows of pairs; the largest; the reference: 1 row */
    const int64_t Lp16 = (S + 15) / 16 * 16, Lp32 = (S + 31) / 32 * 32;
    const int64_t d2 = (d + 1) / 2, dv32 = (d + 31) / 32 * 32;
    const int64_t avx2 = (d + 6 + (d + 15) / 16 * 16) * Lp16;
    const int64_t avx512 = (d + 8 + (d + 31) / 32 * 32) * Lp32;
    const int64_t bf16 = round16(d2 * Lp32) + round16((S + 1) / 2 * dv32) + 8 * Lp32 +
                         4 * Lp32 + 8 * d2;
    const int64_t most = avx2 > avx512 ? avx2 : avx512;
    return bf16 > most ? bf16 : most;
}

int64_t mha_attn_short_bwd_ws_floats(int64_t S, int64_t d, int64_t dv, int64_t G, int64_t L) {
    /* K^T, V^T and K panels (Sp d, Sp dv, Sp dp), dK and dV (S dp, S dvp),
     * S and dP rows (8 Sp each), a zero row (Sp), the group's dQ (G L dp):
     * attention_short_avx512.c's bwd_pair_rows */
    const int64_t Sp = (S + 31) / 32 * 32, dp = (d + 31) / 32 * 32, dvp = (dv + 31) / 32 * 32;
    return Sp * (d + dv + dp) + S * (dp + dvp) + 17 * Sp + G * L * dp;
}

mha_status mha_attn_short_f32_avx2(float *ctx, int64_t ldo, const float *q, const float *k,
                                   const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                                   int64_t d, float scale, float *ws) {
    MHA_CHECK(mha_cpu_has_avx2_fma(), MHA_ERR_UNSUPPORTED,
              "kernel: avx2 requested but this CPU lacks AVX2/FMA");
    mha_attn_short_avx2_loop(ctx, ldo, q, k, v, ld, L, S, H, d, scale, -1, ws, MHA_F32, NULL,
                             0);
    return MHA_OK;
}

mha_status mha_attn_short_f32_avx512(float *ctx, int64_t ldo, const float *q, const float *k,
                                     const float *v, int64_t ld, int64_t L, int64_t S,
                                     int64_t H, int64_t d, float scale, float *ws) {
    MHA_TRY(mha_avx512_check());
    (*MHA_AVX512_PICK(mha_attn_short_avx512_loop))(ctx, ldo, q, k, v, ld, L, S, H, d, scale,
                                                   -1, ws, MHA_F32, NULL, 0);
    return MHA_OK;
}

mha_status mha_attn_short_bf16_avx512(void *ctx, mha_dtype out, int64_t ldo, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v, int64_t ld,
                                      int64_t L, int64_t S, int64_t H, int64_t d, float scale,
                                      float *ws) {
    MHA_CHECK(mha_avx512_bf16_runs(), MHA_ERR_UNSUPPORTED,
              "kernel: the bf16 whole-row loop needs AVX512_BF16, which this CPU lacks");
    MHA_CHECK(out == MHA_F32 || out == MHA_BF16, MHA_ERR_DTYPE,
              "attention: the bf16 whole rows write float32 or bf16 only");
    (*MHA_AVX512_PICK(mha_attn_short_bf16_avx512_loop))(ctx, out, ldo, q, k, v, ld, L, S, H, d,
                                                        scale, -1, ws);
    return MHA_OK;
}

/* ---- mha_sdpa_forward's plain problems ---------------------------------------- */

int64_t mha_attn_short_avx512_max_sd(void) {
    if (MHA_ATTN_SHORT_AVX512_MAX_SD >= 0)
        return MHA_ATTN_SHORT_AVX512_MAX_SD;
    if (mha_cpu_is_amd())
        return 524288;
    return mha_cpu_l2_bytes() / 16; /* 8 S d bytes <= L2 / 2 */
}

/* q, k, v and out all float32; q, k, v bf16 (with bf16_dots) and out
 * float32 or bf16; or q, k, v half to be widened (fp16, or bf16 without
 * bf16_dots) and out of any float dtype. */
static bool short_dtypes(const mha_attn_problem *p, bool bf16_dots) {
    const mha_dtype q = p->q.dtype;
    if (q != p->k.dtype || q != p->v.dtype)
        return false;
    if (q == MHA_F32)
        return p->o.dtype == MHA_F32;
    if (q == MHA_BF16 && bf16_dots)
        return p->o.dtype == MHA_F32 || p->o.dtype == MHA_BF16;
    return q == MHA_F16 || q == MHA_BF16;
}

/* Whether p's half q, k, v go to the float32 loop widened (not to the
 * bf16 loop). */
static bool widened(const mha_attn_problem *p, mha_kernel kernel, bool bf16_dots) {
    return p->q.dtype != MHA_F32 &&
           !(p->q.dtype == MHA_BF16 && kernel == MHA_KERNEL_AVX512 && bf16_dots);
}

bool mha_attn_short_serves(const mha_attn_problem *p, mha_kernel kernel, bool bf16_dots) {
    const mha_tensor *t[4] = {&p->q, &p->k, &p->v, &p->o};
    for (int i = 0; i < 4; i++)
        if (t[i]->stride[3] != 1)
            return false;
    if (kernel != MHA_KERNEL_AVX2 && kernel != MHA_KERNEL_AVX512)
        return false;
    if (!short_dtypes(p, kernel == MHA_KERNEL_AVX512 && bf16_dots))
        return false;
    /* causal on the main diagonal only (L = S: top-left = bottom-right) */
    const bool diagonal = p->causal == MHA_CAUSAL_NONE ||
                          (!p->offsets.data && !p->bottom_right_kv && p->causal_offset == 0);
    const bool plain = !p->mask.data && !p->kpm.data && diagonal &&
                       !p->dropout && !p->attn_weights.data && p->softcap <= 0.0f &&
                       !p->window && !p->kv_len.data && !p->alibi.data && !p->sinks.data &&
                       !p->qk.data && !p->softmax_f64 && !p->onnx_scale;
    /* the log-sum-exp (a training forward's) from the float32 loops; the
     * bf16 twin does not write it */
    const bool bf16_twin = p->q.dtype != MHA_F32 && !widened(p, kernel, bf16_dots);
    if (p->lse.data && bf16_twin)
        return false;
    const bool shaped = p->L == p->S && p->d == p->dv && p->q.stride[2] == p->k.stride[2] &&
                        p->k.stride[2] == p->v.stride[2];
    /* both measured faster than the flash tiles up to their bound
     * (attention_short.h) */
    const int64_t most =
        kernel == MHA_KERNEL_AVX512 ? mha_attn_short_avx512_max_sd() : MHA_ATTN_SHORT_AVX2_MAX_SD;
    const bool fits = p->S * p->d <= most;
    return plain && shaped && fits;
}

/* Workspace floats of one thread, a whole number of 64-byte lines. */
static int64_t thread_floats(int64_t S, int64_t d) {
    return (mha_attn_short_ws_floats(S, d) + 15) / 16 * 16;
}

size_t mha_attn_short_scratch_bound(int64_t S, int64_t d, int nthreads) {
    return sizeof(float) * (size_t)thread_floats(S, d) * (size_t)nthreads;
}

/* Query rows per item: whole heads when there are enough of them for the
 * threads (mha_chunk_items_wanted), else pieces of a multiple of 8 rows
 * (the avx512 loop's blocks; each item gathers its head's K^T, 1/(2 rows)
 * of its FMAs). */
static int64_t rows_per_item(const mha_attn_problem *p, int nthreads) {
    const int64_t heads = p->B * p->Hq, want = mha_chunk_items_wanted(nthreads);
    if (heads >= want)
        return p->L;
    const int64_t pieces = (want + heads - 1) / heads;
    const int64_t rows = ((p->L + pieces - 1) / pieces + 7) / 8 * 8;
    return rows < 64 ? 64 : rows;
}

/* n rows of a half tensor (rows ld elements apart, unit column stride)
 * -> dst (n, d) float32, widened exactly by the ISA's widen_row: in one
 * call when the rows are contiguous (ld = d: a call per row of d = 32 had
 * been a tenth of the B32 H12 L128 bf16 forward). */
static void widen_rows(float *dst, const uint16_t *src, int64_t ld, mha_dtype dt, int64_t n,
                       int64_t d, const mha_flash_isa *isa) {
    if (ld == d) {
        isa->widen_row(dst, src, dt, n * d);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        isa->widen_row(dst + i * d, src + i * ld, dt, d);
}

/* Half q, k, v the bf16 loop does not take (fp16, or bf16 without
 * bf16_dots) are widened item by item into a per-thread buffer (the item's
 * q rows, its kv head's K and V rows, float32 out rows when out is half)
 * and run on the float32 loop with P rounded to v's dtype (p->p_dtype), so
 * the products and P are the flash driver's on the same half values, the
 * sums in another order.  Widening per item repeats K and V for each query
 * head and piece of rows, 1 / (2 rows) of the item's FLOPs; copies of the
 * whole tensors (34 MiB at B 8 H 8 L 512 d 64, past glibc's largest mmap
 * threshold) came back as fresh pages on every call, a page fault each 4
 * KiB: 30 ms a call there against 19 per item (Xeon, 2 threads). */
mha_status mha_attn_short_run(const mha_attn_problem *p, mha_kernel kernel, bool bf16_dots) {
    const bool widen = widened(p, kernel, bf16_dots);
    const bool bf16 = p->q.dtype == MHA_BF16 && !widen;
    const mha_attn_short_fn fn =
        bf16 ? NULL
        : kernel == MHA_KERNEL_AVX512 ? *MHA_AVX512_PICK(mha_attn_short_avx512_loop)
                                      : mha_attn_short_avx2_loop;
    const mha_attn_short_bf16_fn fn16 =
        bf16 ? *MHA_AVX512_PICK(mha_attn_short_bf16_avx512_loop) : NULL;
    const mha_flash_isa *isa = !widen                        ? NULL
                               : kernel == MHA_KERNEL_AVX512 ? MHA_AVX512_PICK(mha_flash_isa_avx512)
                                                             : &mha_flash_isa_avx2;
    const size_t es = p->o.dtype == MHA_F32 ? 4 : 2, qes = p->q.dtype == MHA_F32 ? 4 : 2;
    const int nthreads = mha_threads();
    const int64_t rows = rows_per_item(p, nthreads), pieces = (p->L + rows - 1) / rows;
    const int64_t d = p->d;
    const bool half_out = widen && p->o.dtype != MHA_F32;
    /* the widened item: q (rows, d), k and v (S, d), out (rows, d) if half */
    const size_t per_widen =
        widen ? (size_t)round16((2 * p->S + (half_out ? 2 : 1) * rows) * d) : 0;
    const size_t need = mha_attn_short_scratch_bound(p->S, d, nthreads);
    const bool planned = p->scratch && p->scratch_bytes >= need;
    float *buf = planned ? p->scratch : mha_malloc(need);
    float *wbuf = widen ? mha_malloc(sizeof(float) * per_widen * (size_t)nthreads) : NULL;
    if (!buf || (widen && !wbuf)) {
        if (!planned)
            mha_free(buf);
        mha_free(wbuf);
        return mha_error(MHA_ERR_NOMEM, "attention: cannot allocate %zu bytes of workspace",
                         need + sizeof(float) * per_widen * (size_t)nthreads);
    }
    const int64_t items = p->B * p->Hq * pieces, G = p->Hq / p->Hkv, ld = p->q.stride[2];
    const size_t per_thread = (size_t)thread_floats(p->S, d);
    const bool causal = p->causal != MHA_CAUSAL_NONE;

#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t t = 0; t < items; t++) {
        const int64_t b = t / (p->Hq * pieces), h = t / pieces % p->Hq, hk = h / G;
        const int64_t i0 = t % pieces * rows, n = p->L - i0 < rows ? p->L - i0 : rows;
        const int64_t qo = b * p->q.stride[0] + h * p->q.stride[1] + i0 * ld;
        const int64_t ko = b * p->k.stride[0] + hk * p->k.stride[1];
        const int64_t vo = b * p->v.stride[0] + hk * p->v.stride[1];
        const int64_t oo = b * p->o.stride[0] + h * p->o.stride[1] + i0 * p->o.stride[2];
        float *lse = p->lse.data ? (float *)p->lse.data + b * p->lse.stride[0] +
                                       h * p->lse.stride[1] + i0 * p->lse.stride[2]
                                 : NULL;
        const int tid = mha_thread_index();
        float *ws = buf + (size_t)tid * per_thread;
        /* causal (L = S): rows i0.. see keys 0..i0 + n - 1 only */
        const int64_t diag = causal ? i0 : -1, S = causal ? i0 + n : p->S;
        void *o = (char *)p->o.data + (size_t)oo * es;
        const void *q = (const char *)p->q.data + (size_t)qo * qes;
        const void *k = (const char *)p->k.data + (size_t)ko * qes;
        const void *v = (const char *)p->v.data + (size_t)vo * qes;
        if (bf16) {
            fn16(o, p->o.dtype, p->o.stride[2], q, k, v, ld, n, S, 1, d, p->scale, diag, ws);
        } else if (!widen) {
            fn(o, p->o.stride[2], q, k, v, ld, n, S, 1, d, p->scale, diag, ws, MHA_F32, lse,
               p->lse.stride[2]);
        } else {
            float *qw = wbuf + (size_t)tid * per_widen, *kw = qw + rows * d, *vw = kw + p->S * d;
            float *ow = vw + p->S * d;
            widen_rows(qw, q, ld, p->q.dtype, n, d, isa);
            widen_rows(kw, k, ld, p->q.dtype, S, d, isa);
            widen_rows(vw, v, ld, p->q.dtype, S, d, isa);
            if (!half_out) {
                fn(o, p->o.stride[2], qw, kw, vw, d, n, S, 1, d, p->scale, diag, ws, p->p_dtype,
                   lse, p->lse.stride[2]);
            } else {
                fn(ow, d, qw, kw, vw, d, n, S, 1, d, p->scale, diag, ws, p->p_dtype, lse,
                   p->lse.stride[2]);
                if (p->o.stride[2] == d) /* contiguous rows: one call */
                    isa->narrow_row((uint16_t *)o, ow, n * d, p->o.dtype);
                else
                    for (int64_t i = 0; i < n; i++)
                        isa->narrow_row((uint16_t *)o + i * p->o.stride[2], ow + i * d, d,
                                        p->o.dtype);
            }
        }
    }
    if (!planned)
        mha_free(buf);
    mha_free(wbuf);
    return MHA_OK;
}

void mha_attn_short_f32_ref(float *ctx, int64_t ldo, const float *q, const float *k,
                            const float *v, int64_t ld, int64_t L, int64_t S, int64_t H,
                            int64_t d, float scale, float *ws) {
    float *s = ws; /* (S) scores of one query row */
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < L; i++) {
            const float *qi = q + i * ld + h * d;
            float m = -INFINITY;
            for (int64_t j = 0; j < S; j++) {
                const float *kj = k + j * ld + h * d;
                float dot = 0.0f;
                for (int64_t c = 0; c < d; c++)
                    dot += qi[c] * kj[c];
                s[j] = dot * scale;
                m = s[j] > m ? s[j] : m;
            }
            float l = 0.0f;
            for (int64_t j = 0; j < S; j++) {
                s[j] = expf(s[j] - m);
                l += s[j];
            }
            float *o = ctx + i * ldo + h * d;
            for (int64_t c = 0; c < d; c++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < S; j++)
                    acc += s[j] * v[j * ld + h * d + c];
                o[c] = acc / l;
            }
        }
    }
}
