/* internal.h - shared helpers of the library; never installed. */
#ifndef MHA_INTERNAL_H
#define MHA_INTERNAL_H

#include "mha.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__)
#define MHA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define MHA_HIDDEN __attribute__((visibility("hidden")))
#else
#define MHA_PRINTF(f, a)
#define MHA_HIDDEN
#endif

/* ---- errors -------------------------------------------------------------- */

/* Records a formatted message for mha_last_error() and returns status. */
mha_status mha_error(mha_status status, const char *fmt, ...) MHA_PRINTF(2, 3);

/* The one checking macro: records the message and returns the status. */
#define MHA_CHECK(cond, status, ...) \
    do {                             \
        if (!(cond))                 \
            return mha_error((status), __VA_ARGS__); \
    } while (0)

/* NULL options mean the defaults (mha.h, OPTIONS): at the top of a public
 * function taking `const type *opt`, points opt at type_init()'s defaults
 * when the caller passed NULL. */
#define MHA_OPTIONS_DEFAULT(type, opt) \
    type opt##_defaults_;              \
    if (!(opt)) {                      \
        type##_init(&opt##_defaults_); \
        (opt) = &opt##_defaults_;      \
    }

/* Propagates a failing status. */
#define MHA_TRY(expr)                      \
    do {                                   \
        mha_status mha_try_s_ = (expr);    \
        if (mha_try_s_ != MHA_OK)          \
            return mha_try_s_;             \
    } while (0)

/* Formats a tensor's shape as "(2,7,4)" into buf; returns buf. */
const char *mha_shape_str(const mha_tensor *t, char *buf, size_t size);
#define MHA_SHAPE_BUF 96

/* ---- allocation ---------------------------------------------------------- */

/* All library allocations go through these, so tests can inject failures.
 * mha_malloc returns 64-byte aligned memory; free it with mha_free. */
void *mha_malloc(size_t bytes);
void *mha_calloc(size_t count, size_t size);

/* THE "caller's workspace or our own" rule of every planned call: the
 * caller's workspace when given (at least need bytes, float-aligned, else
 * MHA_ERR_VALUE naming `what`), or one mha_malloc of need bytes, which
 * *owned then holds (NULL otherwise; mha_free(*owned) when done). */
mha_status mha_workspace_get(void *workspace, size_t workspace_bytes, size_t need,
                             const char *what, float **ws, float **owned);
void mha_free(void *p);

#ifdef MHA_TEST_HOOKS /* test builds only (docs/errors.md "Test hooks") */
/* Fail the k-th allocation from now on (k >= 1), and every later one when
 * persistent.  k = 0 disables injection.  Returns allocations so far. */
MHA_API void mha_test_fail_alloc(int64_t k, int persistent);
MHA_API int64_t mha_test_alloc_count(void);
/* Allocations made by mha_malloc/mha_calloc and not yet given to mha_free:
 * the OOM tests check it returns to its value before a failed call. */
MHA_API int64_t mha_test_live_allocs(void);
#endif

/* ---- checked arithmetic -------------------------------------------------- */

static inline bool mha_mul_overflows(int64_t a, int64_t b, int64_t *r) {
    return __builtin_mul_overflow(a, b, r);
}
static inline bool mha_size_mul_overflows(size_t a, size_t b, size_t *r) {
    return __builtin_mul_overflow(a, b, r);
}

/* Product of the first n sizes into *r; false on overflow. */
bool mha_product(const int64_t *sizes, int n, int64_t *r);

/* ---- tensor checks ------------------------------------------------------- */

/* Validates a tensor argument: non-NULL view and data (unless empty),
 * exact rank, dtype.  name is used in messages. */
mha_status mha_check_tensor(const mha_tensor *t, const char *name, int ndim, mha_dtype dtype);
/* The same for a tensor of any float dtype: MHA_F32, MHA_F16 or MHA_BF16. */
mha_status mha_check_float_tensor(const mha_tensor *t, const char *name, int ndim);

/* Checks that the view's largest offset fits in memory arithmetic. */
mha_status mha_check_extent(const mha_tensor *t, const char *name);

/* An output view must not write one element twice: its dims of size > 1,
 * taken by increasing stride, each step past the span of the smaller ones
 * (a broadcast view, stride 0, is refused).  MHA_ERR_ALIAS naming `name`.
 * Call after mha_check_tensor (the spans are then known to fit). */
mha_status mha_check_writable(const mha_tensor *t, const char *name);

/* True when the memory spans of a and b overlap. */
bool mha_tensors_overlap(const mha_tensor *a, const mha_tensor *b);

/* True when a and b view the same elements with the same layout. */
bool mha_tensors_same(const mha_tensor *a, const mha_tensor *b);

/* Element offset of index idx (ndim entries). */
static inline int64_t mha_offset(const mha_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++)
        off += idx[i] * t->stride[i];
    return off;
}

/* A view of t with its dims right-aligned to 4 and broadcast to want
 * (B,H,L,S): size-1 or missing dims get stride 0.  Fails with a message
 * naming `name` when a dim is neither 1 nor equal. */
mha_status mha_broadcast4(const mha_tensor *t, const char *name, const int64_t want[4],
                          mha_tensor *view);

/* Reads element `off` of a mask view as an additive float:
 * f32 as is; bool through polarity (masked -> -inf, kept -> 0). */
static inline float mha_mask_value(const mha_tensor *m, int64_t off, mha_mask_polarity pol) {
    if (m->dtype == MHA_F32)
        return ((const float *)m->data)[off];
    bool truth = ((const uint8_t *)m->data)[off] != 0;
    bool masked = (pol == MHA_TRUE_MASKS) ? truth : !truth;
    return masked ? -__builtin_inff() : 0.0f;
}

/* ---- threads ------------------------------------------------------------- */
int mha_threads(void); /* the count a parallel region should use (>= 1) */
/* The calling thread's index in its parallel region (0 outside one, and
 * in a build without OpenMP): the one place kernels ask it. */
static inline int mha_thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* ---- the environment's kernel and GEMM choice (runtime.c) ---------------- */
/* MHA_KERNEL's choice, AUTO when unset, empty or unknown (an unknown value
 * is reported by mha_runtime_check, which every computing entry calls). */
mha_kernel mha_runtime_kernel_env(void);
/* True when the CPU has AVX2 and FMA (runtime.c: the one probe). */
bool mha_cpu_has_avx2_fma(void);
/* True when the CPU (and OS) run the avx512 kernels: AVX-512 F/DQ/BW/VL; and
 * when it also has AVX512_BF16 (vdpbf16ps). */
bool mha_cpu_has_avx512(void);
bool mha_cpu_has_avx512_bf16(void);
/* True when the CPU has AMX-TILE and AMX-BF16 besides AVX512_BF16, the OS
 * saves the tile state, and it granted this process the tile data (Linux
 * arch_prctl, asked once): the avx512 kernel then multiplies bf16 tensors
 * on AMX tiles.  MHA_AMX=off (read once) says no, to compare. */
bool mha_cpu_has_amx_bf16(void);
/* What the avx512 kernel choice runs on: the CPU, or (test builds,
 * MHA_TEST_AVX512=emulate) the emulated twins of its loops.  Dispatch checks
 * mha_avx512_runs() and takes its tables with MHA_AVX512_PICK. */
bool mha_avx512_emulated(void);
bool mha_avx512_runs(void);
bool mha_avx512_bf16_runs(void);
/* True when the CPU has AVX512_BF16 and its vdpbf16ps is faster than the
 * float32 FMA (AMD Zen 4; not the Intel Xeons measured): the avx512 kernel
 * then multiplies bf16 tensors as pairs, otherwise it widens them. */
bool mha_cpu_bf16_dot_is_fast(void);
/* The CPU's vendor is AMD (CPUID leaf 0), and its L2 cache per core in
 * bytes (512 KiB when the CPU does not say): facts the kernels' size
 * rules read (attention_short.c), never a timing, so one machine always
 * takes the same loops and the same bits. */
bool mha_cpu_is_amd(void);
int64_t mha_cpu_l2_bytes(void);
/* MHA_OK when mha_avx512_runs(), else MHA_ERR_UNSUPPORTED naming AVX-512:
 * the one refusal of every avx512 dispatch (never a silent fallback). */
mha_status mha_avx512_check(void);
#if defined(MHA_TEST_HOOKS) && defined(MHA_HAVE_AVX512_EMULATION)
/* &sym, or &sym_emu (the emulated build of the same source) when emulating */
#define MHA_AVX512_PICK(sym) (mha_avx512_emulated() ? &sym##_emu : &sym)
#define MHA_AVX512_DECLARE(type, sym) extern const type sym, sym##_emu
#else
#define MHA_AVX512_PICK(sym) (&sym)
#define MHA_AVX512_DECLARE(type, sym) extern const type sym
#endif
/* In a _avx512.c kernel file: the name an exported table is defined under. */
#ifdef MHA_AVX512_EMULATED
#define MHA_AVX512_SYMBOL(sym) sym##_emu
#else
#define MHA_AVX512_SYMBOL(sym) sym
#endif

/* Work items the fused kernels put in one chunk of (b, kv head) pairs at
 * least: twice the threads, 16 at least, so every thread has work and the
 * dynamic schedule some slack.  Only the schedule depends on it, never a
 * result (runtime.c). */
int64_t mha_chunk_items_wanted(int nthreads);

/* ---- dropout ------------------------------------------------------------- */

/* Uniform [0,1) from a counter-based hash of (seed, b, h, i, j).
 * ref: Steele, Lea, Flood, "Fast splittable pseudorandom number generators"
 * (SplitMix64 finaliser), applied to a mix of the coordinates. */
float mha_dropout_uniform(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t j);

/* ---- internal kernels ---------------------------------------------------- */

/* Everything the attention kernels need, resolved and validated.
 * Shapes: q (B,Hq,L,d) k (B,Hkv,S,d) v (B,Hkv,S,dv) o (B,Hq,L,dv),
 * mask/kpm broadcast to (B,Hq,L,S) (stride 0 where broadcast), weights
 * (B,Hq,L,S) or data NULL. */
typedef struct mha_attn_problem {
    int64_t B, Hq, Hkv, L, S, d, dv;
    float scale;
    mha_causal causal;
    int64_t causal_offset;         /* key j masked when j > i + causal_offset */
    mha_tensor q, k, v, o;         /* each MHA_F32, MHA_F16 or MHA_BF16 (forward) */
    mha_dtype p_dtype;             /* P rounded to it before P.V: v's dtype when half;
                                    * MHA_F32 (0): not rounded */
    mha_tensor mask;               /* data NULL when absent */
    mha_mask_polarity mask_polarity;
    mha_tensor kpm;                /* (B,Hq,L,S) view of the (B,S) mask */
    mha_mask_polarity kpm_polarity;
    mha_masked_rows masked_rows;
    bool dropout;                  /* training && p > 0 */
    float dropout_p;
    uint64_t seed;
    mha_tensor attn_weights;       /* data NULL when not requested */

    /* ---- modern options (src/attention_opts.c); zero = off, so a
     * memset problem keeps the classic semantics ---- */
    float softcap;                 /* > 0: softcap*tanh(s/softcap) before bias */
    bool window;                   /* window_left/right below apply        */
    int64_t window_left;           /* -1 unbounded: j >= i + o_b - left     */
    int64_t window_right;          /* -1 unbounded: j <= i + o_b + right    */
    mha_tensor offsets;            /* (B) I64 o_b, data NULL: causal_offset */
    mha_tensor kv_len;             /* (B) I64 S_b, data NULL: S             */
    bool bottom_right_kv;          /* causal BOTTOM_RIGHT with kv_len: o_b = S_b - L */
    mha_tensor alibi;              /* (Hq) F32 slopes, data NULL when off   */
    mha_tensor sinks;              /* (Hq) F32 logits, data NULL when off   */
    mha_tensor lse;                /* (B,Hq,L) data NULL when not requested */
    void *scratch;                 /* caller-planned kernel workspace, or NULL */
    size_t scratch_bytes;          /* its size; a kernel that needs more allocates */
    mha_tensor qk;                 /* (B,Hq,L,S) data NULL when not requested */
    int qk_mode;                   /* 0..3 for qk                            */
    bool softmax_f64;              /* the reference kernel only              */
    bool onnx_scale;               /* q, k each times qk_scale = sqrt(scale) */
    float qk_scale;
} mha_attn_problem;

/* Per-batch offset o_b of the causal diagonal and window (query row i sits
 * at position i + o_b) and valid key count S_b. */
static inline int64_t mha_attn_offset(const mha_attn_problem *p, int64_t b) {
    if (p->offsets.data)
        return ((const int64_t *)p->offsets.data)[b * p->offsets.stride[0]];
    if (p->bottom_right_kv)
        return ((const int64_t *)p->kv_len.data)[b * p->kv_len.stride[0]] - p->L;
    return p->causal_offset;
}
static inline int64_t mha_attn_kv_len(const mha_attn_problem *p, int64_t b) {
    return p->kv_len.data ? ((const int64_t *)p->kv_len.data)[b * p->kv_len.stride[0]] : p->S;
}

/* True when p needs the reference kernel (float64 softmax; the fused
 * kernels serve every other option): AUTO then runs the reference and an
 * explicit SCALAR/AVX2/AVX512 is MHA_ERR_UNSUPPORTED. */
bool mha_attn_needs_ref(const mha_attn_problem *p);

/* Validates the modern options of opt into p (B..dv, causal, causal_offset
 * already set); `out` and the inputs for alias checks.  May allocate rotated
 * copies of q and k for RoPE into *rope_buf (free with mha_free). */
mha_status mha_attn_check_modern(mha_attn_problem *p, const mha_sdpa_options *opt,
                                 const mha_tensor *out, float **rope_buf);

/* The score transform shared by the fused kernels: softcap of a scaled
 * score, cap * tanh(s / cap).  tanh through one expf: (1 - e^-2|y|) /
 * (1 + e^-2|y|), |error| <= 1e-7 (2.5x faster than tanhf here); the
 * reference kernel uses tanh in float64. */
static inline float mha_attn_softcap(float s, float cap) {
    if (!(cap > 0.0f))
        return s;
    const float y = s / cap, t = expf(-2.0f * fabsf(y));
    return cap * copysignf((1.0f - t) / (1.0f + t), y);
}

/* A softmax weight e^x (x = s - max <= 0, or NaN) for the portable loops
 * and the flash driver's rescaling: expf, but exactly 0 below x = -69 (e^x
 * < 1e-30).  Denormal floats cost microcode assists on Intel: a weight
 * below FLT_MIN (x < -87.34), or one just above it times a value below 1
 * (the portable P V multiplies and adds unfused, so the product rounds on
 * its own), made a forward whose rows' scores spread past 87 run 5.5x
 * slower (bench/score_spread.c, MHA_KERNEL=scalar); from 1e-30 a product
 * stays normal for any |v| >= 1e-8.  Such a weight is below any row sum
 * >= 1 by 30 decades.  NaN stays NaN.  The backward's row_grad loops
 * (attention_bwd.h) flush P and dS at the same x. */
#define MHA_SOFTMAX_FLUSH_X (-69.0f)
static inline float mha_softmax_weight(float x) {
    return x < MHA_SOFTMAX_FLUSH_X ? 0.0f : expf(x);
}

/* The additive bias of score (b,h,i,j): src/kernels/attention_bias.h. */

/* Validates the masked-row policy and dropout options into p. */
/* THE SDPA problem that (q, k, v, opt) describe, for the forward, the
 * backward and (through mha_sdpa_forward) ONNX: tensor and shape checks,
 * overflow of the kernels' index products, scale, causal alignment, masks
 * and key padding broadcast to (B,Hq,L,S), masked_rows and dropout
 * (mha_attn_check_common); p->q/k/v set.  out (B,Hq,L,dv) or NULL (the
 * backward): its shape, writability and overlap with q/k/v/masks are
 * checked where the forward always checked them (before the size
 * products), and p->o set.  The callers layer their other outputs' checks
 * and mha_attn_check_modern after it. */
mha_status mha_sdpa_problem_init(mha_attn_problem *p, const mha_tensor *q, const mha_tensor *k,
                                 const mha_tensor *v, const mha_tensor *out,
                                 const mha_sdpa_options *opt);
/* MHA_OK when causal is MHA_CAUSAL_NONE or MHA_CAUSAL_TOP_LEFT, the two
 * alignments of the modules without key lengths or offsets (multihead,
 * layers, the model, the ring layer); else MHA_ERR_VALUE naming `who`. */
mha_status mha_check_causal_top_left(mha_causal causal, const char *who);
/* p->scale from opt (scale_set: finite) or 1/sqrt(p->d); decode uses it too. */
mha_status mha_attn_resolve_scale(mha_attn_problem *p, const mha_sdpa_options *opt);
mha_status mha_attn_check_common(mha_attn_problem *p, mha_masked_rows masked_rows, int training,
                                 float dropout_p, uint64_t seed);

/* Runs a validated problem on the requested kernel (AUTO resolves). */
mha_status mha_attn_run(const mha_attn_problem *p, mha_kernel kernel);

/* The fastest kernel this CPU runs (src/kernels/attention_flash*.c). */
mha_kernel mha_attn_best_kernel(void);

/* The kernels, one signature (src/kernels/):
 *   ref    naive loops, float64 accumulation, builds each score row;
 *   scalar fused tiles with online softmax, portable C;
 *   avx2   the same with AVX2+FMA microkernels;
 *   avx512 the same with AVX-512 microkernels. */
mha_status mha_attn_fwd_f32_ref(const mha_attn_problem *p);

/* Bytes of scratch the forward kernels need for a problem of these sizes
 * with mha_threads() threads, for any options: the planned workspace a
 * caller passes in mha_attn_problem.scratch so the call allocates nothing.
 * d, dv >= 1. */
size_t mha_attn_scratch_bound(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                              int64_t d, int64_t dv);
size_t mha_attn_flash_scratch_bound(int64_t B, int64_t Hkv, int64_t S, int64_t d, int64_t dv,
                                    int nthreads);
mha_status mha_attn_fwd_f32_scalar(const mha_attn_problem *p);
mha_status mha_attn_fwd_f32_avx2(const mha_attn_problem *p);
mha_status mha_attn_fwd_f32_avx512(const mha_attn_problem *p);

/* ---- multi-head attention with a caller workspace (src/multihead.c) ----- */

/* Floats of workspace mha_multihead_forward_ws needs when need_weights is
 * off (per-head weights are then written straight to the caller's tensor;
 * averaged weights need B*H*L*S' more): qkv (B,max(L,S'),3E) + attn (B,L,E).
 * S' = S + bias_kv + add_zero_attn. */
mha_status mha_multihead_workspace_floats(int64_t B, int64_t L, int64_t Sx, int64_t E, int64_t H,
                                          int64_t *floats);

/* mha_multihead_forward with a caller workspace (NULL: allocate one).  With a
 * workspace of enough floats it allocates nothing, except the combined mask
 * when bias_k/bias_v or add_zero_attn meet a mask; too small a workspace is
 * MHA_ERR_VALUE.  lse (B,H,L), when not NULL, receives each attention row's
 * log-sum-exp (what the backward recomputes softmax from). */
mha_status mha_multihead_forward_ws(mha_tensor *out, const mha_tensor *query,
                                    const mha_tensor *key, const mha_tensor *value,
                                    const mha_multihead_weights *w,
                                    const mha_multihead_options *opt, float *workspace,
                                    int64_t workspace_floats, float *lse);

/* ---- dense linear algebra ------------------------------------------------ */

/* y (M,N) = x (M,K) w^T (w is (N,K), PyTorch Linear layout) + bias (N) or 0.
 * x rows have stride ldx, y rows ldy, w rows ldw (all in elements).
 * accumulate != 0 adds to y instead of overwriting. */
void mha_linear_f32(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                    int64_t ldw, const float *bias, int64_t M, int64_t N, int64_t K,
                    int accumulate);

/* The backward's products, C (M,N) += op(A) B (K,N) (always accumulates):
 * trans_a = 0: A (M,K); trans_a = 1: A (K,M), op(A) = A^T.  Rows lda, ldb,
 * ldc apart.  Same three paths as mha_linear_f32 (src/kernels/gemm.h);
 * bit-identical for any thread count; no allocation. */
void mha_gemm_f32_ab(int trans_a, float *c, int64_t ldc, const float *a, int64_t lda,
                     const float *b, int64_t ldb, int64_t M, int64_t N, int64_t K);

/* ---- KV-cache undo (kv_cache.c), for callers that append and may then fail
 * (the decoder's step): save the slot the next single-token append fills,
 * and rewind to the position before it with the slot's bytes restored, so
 * the cache is bit-identical to before the append. */
size_t mha_kv_cache_slot_bytes(const mha_kv_cache *c); /* B*Hkv*(d+dv) elements */
void mha_kv_cache_slot_save(const mha_kv_cache *c, void *saved);
void mha_kv_cache_rewind(mha_kv_cache *c, int64_t pos, const void *saved);
/* The whole storage, k (B,Hkv,slots,d) and v (B,Hkv,slots,dv) in the cache's
 * dtype, and the bytes allocated for each (for tests). */
void mha_kv_cache_storage(const mha_kv_cache *c, const void **k, size_t *k_bytes,
                          const void **v, size_t *v_bytes);
/* Layer l's self-attention cache of a decoder cache (decoder_decode.c). */
const mha_kv_cache *mha_decoder_cache_layer(const mha_decoder_cache *c, int64_t l);

#endif /* MHA_INTERNAL_H */
