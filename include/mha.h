/*
 * mha.h - multi-head attention and the Transformer block, in C.
 *
 * OVERVIEW
 *   mha computes scaled dot-product attention (SDPA), torch.nn.MultiheadAttention
 *   and the Transformer encoder/decoder layers in float32, with the semantics of
 *   the references people already trust (PyTorch, ONNX), to fp32 rounding.
 *
 *   Tensors are passed as views (mha_tensor): a data pointer, a dtype, up to
 *   4 dimensions and strides in elements.  The library never keeps a pointer to
 *   a caller's tensor after a call returns, never prints, never exits.
 *
 * LETTER LEGEND (used in every shape comment)
 *   B batch, H (or Hq) query heads, Hkv key/value heads, L query length,
 *   S key length, E (or D) model width, d head dim of Q and K, dv head dim of V.
 *
 * A MINIMAL EXAMPLE
 *
 *     float q[1*1*3*4], k[1*1*5*4], v[1*1*5*4], o[1*1*3*4];   // filled by you
 *     mha_tensor Q, K, V, O;
 *     mha_tensor_init(&Q, MHA_F32, q, 4, (int64_t[]){1, 1, 3, 4});
 *     mha_tensor_init(&K, MHA_F32, k, 4, (int64_t[]){1, 1, 5, 4});
 *     mha_tensor_init(&V, MHA_F32, v, 4, (int64_t[]){1, 1, 5, 4});
 *     mha_tensor_init(&O, MHA_F32, o, 4, (int64_t[]){1, 1, 3, 4});
 *     mha_sdpa_options opt;
 *     mha_sdpa_options_init(&opt);
 *     opt.causal = MHA_CAUSAL_TOP_LEFT;
 *     if (mha_sdpa_forward(&O, &Q, &K, &V, &opt) != MHA_OK)
 *         fprintf(stderr, "mha: %s\n", mha_last_error());
 *
 * ERRORS
 *   Every fallible function returns an mha_status.  On failure a thread-local
 *   message names the offending argument and its shape; read it with
 *   mha_last_error().  Outputs are not written half-way: validation happens
 *   before any output element is touched (an allocation failure in the middle
 *   of a call may leave an output partly written, and returns MHA_ERR_NOMEM).
 *
 * OPTIONS
 *   Every function taking a `const mha_*_options *opt` (and mha_model_create
 *   its config, mha_adamw_create its options) reads NULL as the defaults of
 *   the matching *_init(): mha_sdpa_forward(&O, &Q, &K, &V, NULL) is plain
 *   softmax attention.  Where the defaults leave a required value unset
 *   (num_heads of the multihead and layer options is 0) the call fails as
 *   with those defaults: MHA_ERR_VALUE or MHA_ERR_SHAPE naming the field,
 *   never MHA_ERR_NULL.
 *
 * OWNERSHIP AND NAMES
 *   Views never own memory.  mha_tensor_create() gives a view whose data the
 *   caller frees with mha_tensor_free().  One convention for everything that
 *   owns memory: *_create() builds it in memory, *_open() builds it from a
 *   path, and both are undone by the matching *_free(), which accepts NULL
 *   (mha_tensor_create and mha_adamw_create fill a caller's struct, which
 *   *_free empties).  The handle, or the out-pointer that receives it, is
 *   always the first argument (mha_safetensors_open(&st, path),
 *   mha_npy_load(&t, path, want), mha_npy_save(&t, path, as)).
 *   mha_npy_load() and mha_safetensors_get_f32() give an owned tensor (free
 *   with mha_tensor_free).  mha_safe_file_close(f, keep) ends a safe file
 *   instead of a *_free: it decides whether the file is kept.
 *
 * INTEGER TYPES
 *   Counts and sizes of elements, rows, tensors and tokens are int64_t;
 *   size_t is used only for byte sizes (workspaces, saved states, text
 *   lengths in bytes).  int is kept for flags, modes and enums, for ranks
 *   (ndim, at most MHA_SAFETENSORS_MAX_DIMS) and for thread counts
 *   (mha_set_num_threads, as OpenMP's omp_set_num_threads).
 *
 * THREADS
 *   All functions are reentrant; concurrent calls on shared read-only weights
 *   are safe.  Inside a call mha uses OpenMP (when built with it) with
 *   mha_set_num_threads() threads; results are bit-identical for any thread
 *   count.  The caller's floating-point environment is left as it was found.
 */
#ifndef MHA_H
#define MHA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MHA_VERSION_MAJOR 0
#define MHA_VERSION_MINOR 3
#define MHA_VERSION_PATCH 0
#define MHA_VERSION_STRING "0.3.0"

#if defined(MHA_BUILDING_LIBRARY) && defined(__GNUC__)
#define MHA_API __attribute__((visibility("default")))
#else
#define MHA_API
#endif

/* Library version as "MAJOR.MINOR.PATCH" (the one linked, not the header's). */
MHA_API const char *mha_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes (stable values: never renumbered)                           */
/* ------------------------------------------------------------------------ */

typedef enum mha_status {
    MHA_OK = 0,
    MHA_ERR_NULL = 1,        /* a required pointer argument is NULL            */
    MHA_ERR_SHAPE = 2,       /* shapes do not fit together                     */
    MHA_ERR_DTYPE = 3,       /* a tensor has a dtype the argument cannot take   */
    MHA_ERR_VALUE = 4,       /* an option value is invalid (non-finite, range) */
    MHA_ERR_OVERFLOW = 5,    /* a size product overflows                       */
    MHA_ERR_NOMEM = 6,       /* allocation failed                              */
    MHA_ERR_IO = 7,          /* a read or write failed                         */
    MHA_ERR_FORMAT = 8,      /* a file is corrupt, truncated or unsupported    */
    MHA_ERR_ALIAS = 9,       /* an output overlaps an input                    */
    MHA_ERR_UNSUPPORTED = 10 /* valid request this build cannot serve          */
} mha_status;

/* A fixed English name for a status ("shape mismatch"); never NULL. */
MHA_API const char *mha_status_string(mha_status status);

/* Detail of the last failure on this thread ("key_padding_mask: shape (2,7)
 * but key length is 9").  Empty string when nothing failed yet. */
MHA_API const char *mha_last_error(void);

/* ------------------------------------------------------------------------ */
/* Tensor views                                                              */
/* ------------------------------------------------------------------------ */

#define MHA_MAX_DIMS 4

typedef enum mha_dtype {
    MHA_F32 = 0,  /* float                                       */
    MHA_BOOL = 1, /* uint8_t, 0 = false, anything else = true    */
    MHA_F16 = 2,  /* IEEE binary16 (uint16_t bits)                */
    MHA_I64 = 3,  /* int64_t (sequence lengths)                   */
    MHA_BF16 = 4  /* bfloat16: the top 16 bits of a float         */
} mha_dtype;

/* The half types (MHA_F16, MHA_BF16) are storage: the attention kernels
 * accept them for q, k, v and out (mha_sdpa_forward, the backward, the KV
 * cache and decode) and compute in float32; everything else takes
 * MHA_F32.  Rounding from float is to nearest even; NaN stays NaN. */

typedef struct mha_tensor {
    void *data;                       /* first element                    */
    mha_dtype dtype;
    int ndim;                         /* 0..MHA_MAX_DIMS                   */
    int64_t shape[MHA_MAX_DIMS];      /* sizes, >= 0                       */
    int64_t stride[MHA_MAX_DIMS];     /* in elements, may be 0 (broadcast) */
} mha_tensor;

/* Size in bytes of one element of dtype. */
MHA_API size_t mha_dtype_size(mha_dtype dtype);

/* A contiguous (row-major) view of data with the given shape.
 * Fails with MHA_ERR_SHAPE for ndim out of range or negative sizes and
 * MHA_ERR_OVERFLOW when the element count or byte count overflows. */
MHA_API mha_status mha_tensor_init(mha_tensor *t, mha_dtype dtype, void *data,
                                   int ndim, const int64_t *shape);

/* Allocates a zero-filled contiguous tensor; free with mha_tensor_free(). */
MHA_API mha_status mha_tensor_create(mha_tensor *t, mha_dtype dtype, int ndim,
                                     const int64_t *shape);
MHA_API void mha_tensor_free(mha_tensor *t);

/* Number of elements (product of the shape); checked for overflow. */
MHA_API mha_status mha_tensor_numel(const mha_tensor *t, int64_t *numel);

/* dst = src element by element, between MHA_F32, MHA_F16 and MHA_BF16 (any
 * strides, same shape; to half: round to nearest even, overflow to inf).
 * dst must be writable and not overlap src. */
MHA_API mha_status mha_tensor_convert(mha_tensor *dst, const mha_tensor *src);

/* ------------------------------------------------------------------------ */
/* Execution control                                                         */
/* ------------------------------------------------------------------------ */

/* Threads used inside each call (0 = OpenMP's default).  Results do not
 * depend on it.  Process-wide. */
MHA_API void mha_set_num_threads(int n);
MHA_API int mha_get_num_threads(void);

/* Attention kernels.  MHA_KERNEL_AUTO picks the fastest one the CPU runs
 * (avx512, then avx2, then scalar); the environment variable
 * MHA_KERNEL=ref|scalar|avx2|avx512 overrides AUTO.  A kernel the CPU lacks
 * is MHA_ERR_UNSUPPORTED, never a silent fallback. */
typedef enum mha_kernel {
    MHA_KERNEL_AUTO = 0,
    MHA_KERNEL_REF = 1,    /* naive loops, float64 accumulation           */
    MHA_KERNEL_SCALAR = 2, /* fused tiled online-softmax, portable C       */
    MHA_KERNEL_AVX2 = 3,   /* fused tiled online-softmax, AVX2 + FMA       */
    MHA_KERNEL_AVX512 = 4  /* the same on AVX-512 F/BW/VL/DQ; bf16 tiles
                            * use vdpbf16ps where the CPU has AVX512_BF16 */
} mha_kernel;

/* Name of a kernel ("ref", "scalar", "avx2", "avx512"); "auto" for AUTO. */
MHA_API const char *mha_kernel_name(mha_kernel kernel);
/* The kernel AUTO resolves to on this CPU and environment. */
MHA_API mha_kernel mha_kernel_resolve(mha_kernel requested);

/* The SplitMix64 finaliser (Steele, Lea, Flood, OOPSLA 2014): a well-mixed
 * 64-bit hash of x, the library's one source of counter-based randomness. */
MHA_API uint64_t mha_splitmix64(uint64_t x);

/* MHA_OK when the environment's MHA_KERNEL and MHA_GEMM are unset, empty
 * or valid (auto|ref|scalar|avx2|avx512, auto|blas|avx2|portable); else
 * MHA_ERR_VALUE naming the variable and the valid values.  Every call that
 * selects a kernel or a GEMM path returns this error too. */
MHA_API mha_status mha_runtime_check(void);

/* Fills x[0..n) with normal(0, std^2) floats from a counter-based generator:
 * the value at index i depends only on (seed, i); n <= 0 writes nothing. */
MHA_API void mha_randn(float *x, int64_t n, uint64_t seed, float std);

/* ------------------------------------------------------------------------ */
/* Scaled dot-product attention                                              */
/* ------------------------------------------------------------------------ */

/* Where the causal diagonal sits when L != S. */
typedef enum mha_causal {
    MHA_CAUSAL_NONE = 0,
    MHA_CAUSAL_TOP_LEFT = 1,     /* key j masked when j > i (PyTorch is_causal) */
    MHA_CAUSAL_BOTTOM_RIGHT = 2, /* j > i + S - L (FlashAttention >= 2.1)        */
    MHA_CAUSAL_OFFSET = 3        /* j > i + causal_offset                        */
} mha_causal;

/* What a true element of a boolean mask means.  SDPA takes it per mask
 * (attn_mask_polarity, key_padding_polarity); multihead attention and the
 * layers use PyTorch MHA's fixed convention, true = masked (MHA_TRUE_MASKS),
 * and the ONNX operator ONNX's, true = attend (MHA_TRUE_KEEPS). */
typedef enum mha_mask_polarity {
    MHA_TRUE_KEEPS = 0, /* true = attend (SDPA, ONNX)                   */
    MHA_TRUE_MASKS = 1  /* true = masked out (nn.MultiheadAttention)    */
} mha_mask_polarity;

/* Output of a query row whose every key is masked. */
typedef enum mha_masked_rows {
    MHA_MASKED_ROWS_ZERO = 0, /* output 0, attn_weights 0 (SDPA, ONNX, FlashAttention) */
    MHA_MASKED_ROWS_NAN = 1   /* output NaN, attn_weights NaN (PyTorch MHA)          */
} mha_masked_rows;

/* Precision of the softmax.  The fused kernels compute in float32 (a
 * running max and sum); MHA_SOFTMAX_F64 asks for float64 and is served by
 * the reference kernel (AUTO picks it; SCALAR/AVX2 refuse it). */
typedef enum mha_softmax_precision {
    MHA_SOFTMAX_F32 = 0,
    MHA_SOFTMAX_F64 = 1
} mha_softmax_precision;

/* Rotary position embedding conventions (mha_rope_apply). */
typedef enum mha_rope_mode {
    MHA_ROPE_NONE = 0,
    MHA_ROPE_HALF_SPLIT = 1,  /* pairs (c, c + d/2): GPT-NeoX, LLaMA (HF)    */
    MHA_ROPE_INTERLEAVED = 2  /* pairs (2c, 2c + 1): GPT-J, the RoPE paper   */
} mha_rope_mode;

typedef struct mha_sdpa_options {
    int scale_set;          /* 0: scale = 1/sqrt(d)                          */
    float scale;            /* used when scale_set; must be finite            */

    mha_causal causal;
    int64_t causal_offset;  /* for MHA_CAUSAL_OFFSET                         */

    /* Optional attention mask (torch SDPA's attn_mask), broadcast
     * right-aligned to (B,Hq,L,S).  MHA_BOOL: boolean read with
     * attn_mask_polarity; MHA_F32: added to the scores.  (0.1.0: `mask`,
     * `mask_polarity`.) */
    const mha_tensor *attn_mask;
    mha_mask_polarity attn_mask_polarity; /* default MHA_TRUE_KEEPS       */

    /* Optional key padding mask (B,S), MHA_BOOL (with its own polarity) or
     * MHA_F32 (added).  Combined with attn_mask and causal. */
    const mha_tensor *key_padding_mask;
    mha_mask_polarity key_padding_polarity; /* default MHA_TRUE_MASKS     */

    mha_masked_rows masked_rows;         /* default MHA_MASKED_ROWS_ZERO */

    /* Dropout on the attention weights, applied only when training != 0.
     * The keep decision for (b, h, i, j) is a pure function of
     * (seed, b, h, i, j): independent of tiling and threads. */
    int training;
    float dropout_p;        /* in [0, 1)                                    */
    uint64_t seed;

    /* Optional output: the attention probabilities (B,Hq,L,S), after
     * dropout (0.1.0: `weights`). */
    mha_tensor *attn_weights;

    mha_kernel kernel;      /* default MHA_KERNEL_AUTO                       */

    /* ---- modern attention (docs/onnx.md); init's defaults switch all off.
     * Per score, in this order: s = q.k * scale; softcap; + masks, causal,
     * window, key lengths, ALiBi (a masked key is -inf); softmax with the
     * sink; attn_weights; out.  The query row i sits at position p = i + o_b,
     * o_b the causal alignment's offset of batch b (TOP_LEFT 0, BOTTOM_RIGHT
     * S_b - L, OFFSET causal_offset or causal_offsets[b]); with causal NONE
     * the window still uses o_b = causal_offsets[b] or causal_offset. */
    float softcap;          /* > 0: s = softcap*tanh(s/softcap); 0 = off     */
    int64_t window_left;    /* keys j >= p - window_left; -1 = unbounded     */
    int64_t window_right;   /* keys j <= p + window_right; -1 = unbounded    */
    /* (B) MHA_I64 or NULL: per-batch offset o_b (causal and window). */
    const mha_tensor *causal_offsets;
    /* (B) MHA_I64 or NULL: valid keys per batch S_b; keys j >= S_b are
     * masked (an external static cache, ONNX nonpad_kv_seqlen).  With
     * MHA_CAUSAL_BOTTOM_RIGHT, o_b = S_b - L. */
    const mha_tensor *kv_lengths;
    /* (Hq) MHA_F32 or NULL: ALiBi slopes, bias -slope_h * |i + S_b - L - j|
     * (FlashAttention's convention, bottom-right aligned). */
    const mha_tensor *alibi_slopes;
    /* (Hq) MHA_F32 or NULL: attention sinks, a per-head logit joining the
     * softmax denominator (no value row): out = sum_j e^{s_j} v_j /
     * (e^{sink_h} + sum_j e^{s_j}) (gpt-oss, ggml). */
    const mha_tensor *sinks;
    /* Optional output (B,Hq,L): log-sum-exp of each row's scores after
     * masking, sink included; -inf for a fully masked row. */
    mha_tensor *lse;
    /* Optional output (B,Hq,L,S), ONNX qk_matmul_output: qk_mode 0 the
     * scaled q.k, 1 after softcap, 2 after softcap and masks (-inf where
     * masked), 3 the softmax probabilities (as `attn_weights`). */
    mha_tensor *qk_out;
    int qk_mode;
    mha_softmax_precision softmax_precision; /* default MHA_SOFTMAX_F32      */
    /* ONNX's convention: q and k are each multiplied by sqrt(scale) (rounded
     * to float) before the product, instead of the product by scale: the
     * scores differ in the last bits. */
    int onnx_scale;
    /* Rotary embeddings of q and k before the product (mha_rope_apply):
     * key j at position j, query row i at p = i + o_b. */
    mha_rope_mode rope;     /* default MHA_ROPE_NONE                         */
    float rope_base;        /* 0 = 10000                                     */
} mha_sdpa_options;

/* Defaults: scale 1/sqrt(d), no mask, no causal, zeros for masked rows. */
MHA_API void mha_sdpa_options_init(mha_sdpa_options *opt);

/* out (B,Hq,L,dv) = softmax(q k^T * scale + masks) v
 *   q (B,Hq,L,d)  k (B,Hkv,S,d)  v (B,Hkv,S,dv), Hq a multiple of Hkv:
 *   query head h reads kv head h / (Hq/Hkv) (contiguous groups).
 * Any strides are accepted; out must not overlap an input.
 * B or L = 0 gives an empty output; S = 0 gives fully masked rows.
 * Half precision: q, k, v and out may each be MHA_F32, MHA_F16 or MHA_BF16
 * (masks, weights, lse and the other outputs stay MHA_F32).  Half inputs
 * are widened exactly to float32 where the kernels pack them; products,
 * the softmax statistics (max, sum, LSE) and the P.V accumulation are
 * float32.  When v is half, P = exp(s - m) is rounded to v's dtype just
 * before the P.V product (where FlashAttention converts P), the row sum
 * uses the unrounded P, and attn_weights stays unrounded; out is rounded
 * once from the float32 result.  The reference kernel (MHA_KERNEL_REF)
 * follows the same rule with float64 sums.  On AVX512_BF16 CPUs the avx512
 * kernel takes q.k (q and k bf16, onnx_scale off) and P.V (v bf16) as
 * vdpbf16ps dot products of bf16 pairs: the products are exact in float32
 * and summed in float32 (magnitudes below 2^-126 count as 0). */
MHA_API mha_status mha_sdpa_forward(mha_tensor *out, const mha_tensor *q,
                                    const mha_tensor *k, const mha_tensor *v,
                                    const mha_sdpa_options *opt);

/* ------------------------------------------------------------------------ */
/* Modern attention: the ONNX operator, KV caches, decode, merge, RoPE      */
/* (src/onnx_attention.c, src/kv_cache.c, src/rope.c; docs/onnx.md)         */
/* ------------------------------------------------------------------------ */

/* x (B,H,L,d) rotated in place: the pair (x_a, x_b) of channel c < d/2 at
 * position t = pos_offset + i becomes (x_a cos - x_b sin, x_a sin + x_b cos)
 * with angle t * base^(-2c/d); HALF_SPLIT pairs (c, c + d/2), INTERLEAVED
 * (2c, 2c + 1).  d even; base > 0 (0 = 10000).  pos_offsets (B) MHA_I64 or
 * NULL adds a per-batch offset.  Angles in float64, rounded once. */
MHA_API mha_status mha_rope_apply(mha_tensor *x, int64_t pos_offset,
                                  const mha_tensor *pos_offsets, float base,
                                  mha_rope_mode mode);

/* The ONNX Attention operator (opsets 23-25 as onnx 1.23 defines them). */
typedef struct mha_onnx_attention_options {
    int is_causal;
    int scale_set;              /* 0: scale = 1/sqrt(head_size)             */
    float scale;
    int64_t q_num_heads;        /* 3-D inputs only (0 = absent)             */
    int64_t kv_num_heads;
    float softcap;              /* <= 0: off                                */
    int qk_matmul_output_mode;  /* 0..3                                     */
    int softmax_precision;      /* TensorProto dtype 1, 10, 11, 16; 0 = absent */
    int64_t left_window_size;   /* -1 = unbounded (default)                 */
    int64_t right_window_size;
    mha_kernel kernel;
} mha_onnx_attention_options;

MHA_API void mha_onnx_attention_options_init(mha_onnx_attention_options *opt);

/* Output shapes of mha_onnx_attention for these inputs (NULL = absent):
 * y (B,Hq,L,dv) or (B,L,Hq*dv) (ndim 3), present_key (B,Hkv,T,d),
 * present_value (B,Hkv,T,dv), qk (B,Hq,L,T), T = past + kv length.  Runs
 * every check mha_onnx_attention runs on shapes and options. */
typedef struct mha_onnx_attention_shapes {
    int y_ndim;
    int64_t y[4], present_key[4], present_value[4], qk[4];
} mha_onnx_attention_shapes;

MHA_API mha_status mha_onnx_attention_shapes_get(mha_onnx_attention_shapes *s,
                                                 const mha_tensor *q, const mha_tensor *k,
                                                 const mha_tensor *v, const mha_tensor *attn_mask,
                                                 const mha_tensor *past_key,
                                                 const mha_tensor *past_value,
                                                 const mha_tensor *nonpad_kv_seqlen,
                                                 const mha_onnx_attention_options *opt);

/* Y = Attention(Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen?)
 *   q (B,Hq,L,d) k (B,Hkv,S,d) v (B,Hkv,S,dv), or 3-D (B,L,Hq*d) (B,S,Hkv*d)
 *   (B,S,Hkv*dv) with q_num_heads/kv_num_heads; past_key (B,Hkv,P,d) and
 *   past_value (B,Hkv,P,dv) together; nonpad_kv_seqlen (B) MHA_I64, not with
 *   past.  attn_mask MHA_BOOL (true = attend), MHA_F32 or MHA_I64 (added),
 *   broadcast right-aligned to (B,Hq,L,T); a last dim shorter than T is
 *   padded with -inf.  Causal offset: P with past, nonpad[b] - L with
 *   nonpad, else 0; the window uses the same offset.  Outputs (shapes from
 *   mha_onnx_attention_shapes_get): y required; present_key, present_value,
 *   qk_matmul_output optional (NULL).  q, k, v, the pasts, y and the
 *   presents may each be MHA_F32, MHA_F16 or MHA_BF16 (handed to
 *   mha_sdpa_forward as they are; a present is concat(past, new) rounded to
 *   its dtype); qk_matmul_output as mha_sdpa_forward's qk_out. */
MHA_API mha_status mha_onnx_attention(mha_tensor *y, mha_tensor *present_key,
                                      mha_tensor *present_value, mha_tensor *qk_matmul_output,
                                      const mha_tensor *q, const mha_tensor *k,
                                      const mha_tensor *v, const mha_tensor *attn_mask,
                                      const mha_tensor *past_key, const mha_tensor *past_value,
                                      const mha_tensor *nonpad_kv_seqlen,
                                      const mha_onnx_attention_options *opt);

/* A KV cache for autoregressive decoding: per batch row, up to `capacity`
 * keys (B,Hkv,capacity,d) and values (B,Hkv,capacity,dv), allocated once.
 * window in 1..capacity keeps only the last `window` keys (sliding-window
 * attention: the current key and window-1 before it; ONNX left = window-1,
 * right = 0) in a ring of `window` slots, and appends never run out;
 * window = 0 keeps everything and an append past capacity is MHA_ERR_VALUE. */
typedef struct mha_kv_cache mha_kv_cache;

/* dtype is the storage of keys and values: MHA_F32, or MHA_BF16 / MHA_F16
 * for half the memory (anything else: MHA_ERR_DTYPE).  Append takes k/v of
 * any float dtype and rounds to nearest even; decode reads the half values
 * directly and computes in float32, P rounded to dtype before P.V (relative
 * to each split's max; the sum l from the unrounded P). */
MHA_API mha_status mha_kv_cache_create(mha_kv_cache **cache, mha_dtype dtype, int64_t B,
                                       int64_t Hkv, int64_t capacity, int64_t d, int64_t dv,
                                       int64_t window);
/* The storage dtype given to create. */
MHA_API mha_dtype mha_kv_cache_dtype(const mha_kv_cache *cache);
MHA_API void mha_kv_cache_free(mha_kv_cache *cache);
/* Appends n new steps: k (B,Hkv,n,d), v (B,Hkv,n,dv), each F32, F16 or
 * BF16, any strides; validated first (a refused append changes nothing). */
MHA_API mha_status mha_kv_cache_append(mha_kv_cache *cache, const mha_tensor *k,
                                       const mha_tensor *v);
/* Forgets every key (length 0); keeps the memory. */
MHA_API void mha_kv_cache_reset(mha_kv_cache *cache);
/* Tokens appended since create/reset (positions), and keys held now. */
MHA_API int64_t mha_kv_cache_position(const mha_kv_cache *cache);
MHA_API int64_t mha_kv_cache_length(const mha_kv_cache *cache);

/* One decode step: out (B,Hq,1,dv) = attention of q (B,Hq,1,d) over every
 * key in the cache (the new token's key must already be appended), equal to
 * the last row of a causal forward over the whole sequence.  Uses scale,
 * softcap, alibi_slopes, sinks, lse, rope (q at position = cache position
 * - 1; keys must have been rotated before append), kernel and
 * softmax_precision of opt (NULL = defaults); masks, causal and windows
 * come from the cache.  Hq a multiple of Hkv; K/V are never replicated.
 * Long caches are split across threads (per-split max, sum and
 * accumulator, merged by log-sum-exp); bit-identical for any thread count.
 * q and out: F32, F16 or BF16 (out rounded once from the float32 result);
 * lse float32.  Kernel REF reads a half cache's values exactly and rounds
 * P as mha_sdpa_forward's reference does (relative to the row's max). */
MHA_API mha_status mha_attention_decode(mha_tensor *out, const mha_tensor *q,
                                        const mha_kv_cache *cache, const mha_sdpa_options *opt);

/* Merges n partial attention results over disjoint key blocks:
 * out (B,H,L,dv) = sum_p e^{lse_p - lse} out_p, lse = log sum_p e^{lse_p}.
 * parts_out[p] (B,H,L,dv), parts_lse[p] (B,H,L) (lse -inf: an empty part);
 * lse_out (B,H,L) or NULL.  A row empty in every part gives 0 and -inf. */
MHA_API mha_status mha_attention_merge(mha_tensor *out, mha_tensor *lse_out, int64_t n,
                                       const mha_tensor *const *parts_out,
                                       const mha_tensor *const *parts_lse);

/* ------------------------------------------------------------------------ */
/* Multi-head attention, exactly torch.nn.MultiheadAttention(batch_first)   */
/* ------------------------------------------------------------------------ */

/* Parameters in PyTorch's layout and names.  Either in_proj_weight (packed,
 * when kdim == vdim == E) or the three separate projection weights. */
typedef struct mha_multihead_weights {
    const mha_tensor *in_proj_weight;  /* (3E,E), rows q|k|v, or NULL       */
    const mha_tensor *q_proj_weight;   /* (E,E)    when in_proj_weight NULL */
    const mha_tensor *k_proj_weight;   /* (E,kdim)                          */
    const mha_tensor *v_proj_weight;   /* (E,vdim)                          */
    const mha_tensor *in_proj_bias;    /* (3E) or NULL (bias=False)          */
    const mha_tensor *out_proj_weight; /* (E,E)                             */
    const mha_tensor *out_proj_bias;   /* (E) or NULL                        */
    const mha_tensor *bias_k;          /* (E) or (1,1,E), with bias_v, or NULL */
    const mha_tensor *bias_v;          /* (E) or (1,1,E)                     */
} mha_multihead_weights;

typedef struct mha_multihead_options {
    int64_t num_heads;               /* H, must divide E                    */
    int add_zero_attn;               /* append a zero key/value (S += 1)     */

    /* Masks with PyTorch MHA's fixed polarity: MHA_BOOL true = masked,
     * MHA_F32 added to the scores.
     * key_padding_mask (B,S), unbatched (S).
     * attn_mask (L,S) or (B*H,L,S) index b*H+h; unbatched (L,S) or (H,L,S).
     * With add_bias_kv / add_zero_attn the masks cover the caller's S and
     * the extra columns are attended. */
    const mha_tensor *key_padding_mask;
    const mha_tensor *attn_mask;
    /* MHA_CAUSAL_TOP_LEFT: tril(ones(L,S)), combined with the masks (as
     * in SDPA, key j masked when j > i); BOTTOM_RIGHT and OFFSET are
     * MHA_ERR_VALUE here (no key lengths or causal_offset). */
    mha_causal causal;               /* default MHA_CAUSAL_NONE             */

    mha_masked_rows masked_rows;     /* default MHA_MASKED_ROWS_ZERO        */

    /* need_weights: the attention probabilities, averaged (B,L,S') or per
     * head (B,H,L,S'), S' = S + (bias_k != NULL) + add_zero_attn;
     * unbatched drops B.  (0.1.0: `weights`, `average_weights`.) */
    mha_tensor *attn_weights;        /* NULL: need_weights=False            */
    int average_attn_weights;        /* default 1                           */

    int training;
    float dropout_p;
    uint64_t seed;

    mha_kernel kernel;
} mha_multihead_options;

MHA_API void mha_multihead_options_init(mha_multihead_options *opt);

/* Number of parameters of nn.MultiheadAttention(E, H, bias, add_bias_kv,
 * kdim, vdim): 4*E^2 + 4*E for the default module, for any H. */
MHA_API int64_t mha_multihead_param_count(int64_t E, int64_t kdim, int64_t vdim, int bias,
                                          int add_bias_kv);

/* out (B,L,E) = MultiheadAttention(query, key, value)
 *   query (B,L,E), key (B,S,kdim), value (B,S,vdim); unbatched drops B
 *   (query (L,E), key (S,kdim), value (S,vdim), out (L,E)).
 *   key == query and value == query (same pointer or same view) is
 *   self-attention and uses one fused projection. */
MHA_API mha_status mha_multihead_forward(mha_tensor *out, const mha_tensor *query,
                                         const mha_tensor *key, const mha_tensor *value,
                                         const mha_multihead_weights *w,
                                         const mha_multihead_options *opt);

/* ------------------------------------------------------------------------ */
/* Transformer layers: torch.nn.TransformerEncoderLayer/DecoderLayer and    */
/* their pieces (batch_first=True).  docs/layers.md has the semantics table. */
/* ------------------------------------------------------------------------ */

/* Row tensors below are "(N,E)": any rank 1..4, contiguous (row-major),
 * read as N = numel/E rows of the last dimension E.  Unless a function says
 * otherwise, out may be the very same view as x (in place) but must not
 * partly overlap it. */

/* out (N,F) = x (N,E) weight^T + bias; weight (F,E) PyTorch Linear layout,
 * bias (F) or NULL.  out must not overlap x. */
MHA_API mha_status mha_linear_forward(mha_tensor *out, const mha_tensor *x,
                                      const mha_tensor *weight, const mha_tensor *bias);

/* out (N,E) = (x - mean) / sqrt(var + eps) * weight + bias, per row, biased
 * variance (nn.LayerNorm).  weight (E) or NULL (= ones), bias (E) or NULL
 * (= zeros; LayerNorm(bias=False)).  eps > 0 and finite. */
MHA_API mha_status mha_layernorm_forward(mha_tensor *out, const mha_tensor *x,
                                         const mha_tensor *weight, const mha_tensor *bias,
                                         float eps);

/* out (N,E) = x / sqrt(mean(x^2) + eps) * weight (nn.RMSNorm); weight (E) or
 * NULL.  eps > 0 and finite. */
MHA_API mha_status mha_rmsnorm_forward(mha_tensor *out, const mha_tensor *x,
                                       const mha_tensor *weight, float eps);

typedef enum mha_activation {
    MHA_ACT_RELU = 0,      /* max(x, 0)                                       */
    MHA_ACT_GELU = 1,      /* x * Phi(x), exact erf (PyTorch's default)       */
    MHA_ACT_GELU_TANH = 2, /* GELU(approximate='tanh') (GPT-2, llm.c)         */
    MHA_ACT_SILU = 3       /* x * sigmoid(x) (SwiGLU's gate)                  */
} mha_activation;

/* Name ("relu", "gelu", "gelu_tanh", "silu"); "?" for an unknown value. */
MHA_API const char *mha_activation_name(mha_activation act);

/* out = act(x), elementwise; out and x have the same shape (any rank,
 * contiguous). */
MHA_API mha_status mha_activation_forward(mha_tensor *out, const mha_tensor *x,
                                          mha_activation act);

/* out (N,E) = x (N,E) + y (N,E): the residual connection.  out may be x or y. */
MHA_API mha_status mha_residual_forward(mha_tensor *out, const mha_tensor *x,
                                        const mha_tensor *y);

/* Inverted dropout (nn.Dropout): when training and p > 0, element n of x is
 * zeroed with probability p, else scaled by 1/(1-p); otherwise out = x.  The
 * keep decision for flat index n is a pure function of (seed, stream, n):
 * use distinct streams for the dropouts of one step.  p in [0,1). */
MHA_API mha_status mha_dropout_forward(mha_tensor *out, const mha_tensor *x, float p,
                                       int training, uint64_t seed, uint64_t stream);

/* A position-wise MLP: out = linear2(dropout(act(linear1(x)))), or, when
 * linear3_weight is given, the gated form (SwiGLU with act = SiLU, LLaMA's
 * w1/w2/w3): out = linear2(act(linear1(x)) * linear3(x)).  F is the hidden
 * width, read from linear1_weight. */
typedef struct mha_mlp_weights {
    const mha_tensor *linear1_weight; /* (F,E)          */
    const mha_tensor *linear1_bias;   /* (F) or NULL     */
    const mha_tensor *linear2_weight; /* (E,F)          */
    const mha_tensor *linear2_bias;   /* (E) or NULL     */
    const mha_tensor *linear3_weight; /* (F,E) or NULL: gated MLP */
    const mha_tensor *linear3_bias;   /* (F) or NULL     */
} mha_mlp_weights;

/* Bytes of workspace mha_mlp_forward needs for N rows of hidden width F
 * (gated != 0: the gated form). */
MHA_API mha_status mha_mlp_workspace_size(int64_t N, int64_t F, int gated, size_t *bytes);

/* out (N,E) = MLP(x (N,E)); out must not overlap x.  workspace: at least
 * mha_mlp_workspace_size() bytes, float-aligned, or NULL (allocated inside). */
MHA_API mha_status mha_mlp_forward(mha_tensor *out, const mha_tensor *x,
                                   const mha_mlp_weights *w, mha_activation act,
                                   void *workspace, size_t workspace_bytes);

/* Layer weights, named as the PyTorch state_dict (dots -> fields).  Norm
 * weights/biases may be NULL (ones/zeros: bias=False drops the biases of
 * the Linear layers and of the LayerNorms).  The MLP width F comes from
 * linear1_weight (F,E).  The attention blocks take no bias_k/bias_v. */
typedef struct mha_encoder_layer_weights {
    mha_multihead_weights self_attn;     /* self_attn.*                     */
    const mha_tensor *linear1_weight;    /* (F,E)                           */
    const mha_tensor *linear1_bias;      /* (F) or NULL                     */
    const mha_tensor *linear2_weight;    /* (E,F)                           */
    const mha_tensor *linear2_bias;      /* (E) or NULL                     */
    const mha_tensor *norm1_weight, *norm1_bias; /* (E) or NULL each        */
    const mha_tensor *norm2_weight, *norm2_bias;
} mha_encoder_layer_weights;

typedef struct mha_decoder_layer_weights {
    mha_multihead_weights self_attn;      /* self_attn.*                    */
    mha_multihead_weights multihead_attn; /* multihead_attn.* (cross)       */
    const mha_tensor *linear1_weight, *linear1_bias; /* (F,E), (F) or NULL  */
    const mha_tensor *linear2_weight, *linear2_bias; /* (E,F), (E) or NULL  */
    const mha_tensor *norm1_weight, *norm1_bias;     /* (E) or NULL each    */
    const mha_tensor *norm2_weight, *norm2_bias;
    const mha_tensor *norm3_weight, *norm3_bias;
} mha_decoder_layer_weights;

/* Stacks (nn.TransformerEncoder / nn.TransformerDecoder): layers.N.* and an
 * optional final norm.* (final_norm != 0; its weight/bias may be NULL). */
typedef struct mha_encoder_weights {
    int64_t num_layers;                       /* >= 1                        */
    const mha_encoder_layer_weights *layers;  /* num_layers entries          */
    int final_norm;
    const mha_tensor *norm_weight, *norm_bias;
} mha_encoder_weights;

typedef struct mha_decoder_weights {
    int64_t num_layers;
    const mha_decoder_layer_weights *layers;
    int final_norm;
    const mha_tensor *norm_weight, *norm_bias;
} mha_decoder_weights;

/* The masks of one call, PyTorch MHA conventions (bool true = masked,
 * float added).  Encoder: attn_mask = src_mask, key_padding_mask =
 * src_key_padding_mask.  Decoder: attn_mask/key_padding_mask/causal act on
 * the target's self-attention, memory_* on the cross-attention. */
typedef struct mha_layer_masks {
    const mha_tensor *attn_mask;          /* (L,L) or (B*H,L,L)             */
    const mha_tensor *key_padding_mask;   /* (B,L)                          */
    mha_causal causal;                    /* NONE or TOP_LEFT (tril(ones(L,L)))
                                             on the self-attention        */
    const mha_tensor *memory_mask;        /* (L,S) or (B*H,L,S)             */
    const mha_tensor *memory_key_padding_mask; /* (B,S)                     */
} mha_layer_masks;

typedef struct mha_layer_options {
    int64_t num_heads;            /* nhead, divides E                         */
    int norm_first;               /* 0: post-norm (PyTorch default), 1: pre  */
    mha_activation activation;    /* default MHA_ACT_RELU                     */
    float layer_norm_eps;         /* default 1e-5                             */
    mha_masked_rows masked_rows;  /* default MHA_MASKED_ROWS_ZERO; PyTorch: NAN */
    int training;                 /* dropout only when training != 0          */
    float dropout_p;              /* one p for every dropout, as PyTorch       */
    uint64_t seed;
    mha_kernel kernel;
} mha_layer_options;

MHA_API void mha_layer_options_init(mha_layer_options *opt);

/* The workspace plan: bytes a forward call needs for batch B, target length
 * L, memory length S (decoder), width E, MLP width F.  The same size serves
 * a single layer and a stack of any depth.  With a workspace of that size a
 * forward call allocates nothing. */
MHA_API mha_status mha_encoder_workspace_size(int64_t B, int64_t L, int64_t E, int64_t F,
                                              size_t *bytes);
MHA_API mha_status mha_decoder_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E,
                                              int64_t F, size_t *bytes);

/* out (B,L,E) = TransformerEncoderLayer(src (B,L,E)); unbatched (L,E) drops B.
 * out may be the same view as src (in place).  workspace: at least
 * mha_encoder_workspace_size() bytes, float-aligned, or NULL (one allocation
 * inside).  masks may be NULL. */
MHA_API mha_status mha_encoder_layer_forward(mha_tensor *out, const mha_tensor *src,
                                             const mha_encoder_layer_weights *w,
                                             const mha_layer_masks *masks,
                                             const mha_layer_options *opt, void *workspace,
                                             size_t workspace_bytes);

/* out (B,L,E) = TransformerDecoderLayer(tgt (B,L,E), memory (B,S,E)).
 * out may be the same view as tgt, must not overlap memory. */
MHA_API mha_status mha_decoder_layer_forward(mha_tensor *out, const mha_tensor *tgt,
                                             const mha_tensor *memory,
                                             const mha_decoder_layer_weights *w,
                                             const mha_layer_masks *masks,
                                             const mha_layer_options *opt, void *workspace,
                                             size_t workspace_bytes);

/* Stacks: the layers in turn, then the final norm when w->final_norm. */
MHA_API mha_status mha_encoder_forward(mha_tensor *out, const mha_tensor *src,
                                       const mha_encoder_weights *w, const mha_layer_masks *masks,
                                       const mha_layer_options *opt, void *workspace,
                                       size_t workspace_bytes);
MHA_API mha_status mha_decoder_forward(mha_tensor *out, const mha_tensor *tgt,
                                       const mha_tensor *memory, const mha_decoder_weights *w,
                                       const mha_layer_masks *masks,
                                       const mha_layer_options *opt, void *workspace,
                                       size_t workspace_bytes);

/* Token-by-token decoding through a TransformerDecoder stack (eval mode):
 * per layer a self-attention KV cache of `capacity` tokens and the memory's
 * cross-attention K/V, projected once here.  memory (B,S,E) contiguous;
 * the weights' layout as mha_decoder_forward.  Free with
 * mha_decoder_cache_free. */
typedef struct mha_decoder_cache mha_decoder_cache;
MHA_API mha_status mha_decoder_cache_create(mha_decoder_cache **cache,
                                            const mha_decoder_weights *w,
                                            const mha_tensor *memory, int64_t num_heads,
                                            int64_t capacity);
MHA_API void mha_decoder_cache_free(mha_decoder_cache *cache);
/* out (B,1,E) = the last row of mha_decoder_forward(tgt, memory) with a
 * causal target mask, tgt being every token given so far, this one x
 * (B,1,E) last.  No target/memory masks; no dropout. */
MHA_API mha_status mha_decoder_decode_step(mha_tensor *out, const mha_tensor *x,
                                           const mha_decoder_weights *w,
                                           mha_decoder_cache *cache,
                                           const mha_layer_options *opt);

/* ------------------------------------------------------------------------ */
/* Backward passes (gradients).  docs/backward.md has the derivations.      */
/* ------------------------------------------------------------------------ */

/* THE GRADIENT RULE: every *_backward function ADDS its gradients into the
 * caller's buffers (dx += dL/dx); it never overwrites them.  The caller
 * zeroes the gradient buffers (one memset per step when they live in one
 * allocation) before the first backward call of a step.  A NULL gradient
 * pointer means "not wanted" and its computation is skipped where possible.
 *
 * Argument order (as llm.c's *_backward): the gradients being produced,
 * then the upstream gradient dout, then the state saved by the forward,
 * then the forward's inputs, then its weights, then sizes/options.
 *
 * Options are the forward's own options, unchanged (same masks, causal,
 * scale, dropout seed): dropout keep decisions are recomputed from the seed,
 * never stored.  Gradient outputs must not overlap any input.  Results are
 * bit-identical for any thread count.  Fully masked query rows (every key
 * masked) contribute zero gradient under either masked_rows policy.
 * Gradients with respect to masks are not computed (masks are constants). */

/* SDPA backward.  Gradients of L = sum(dout * out) for
 *   out (B,Hq,L,dv) = mha_sdpa_forward(q (B,Hq,L,d), k (B,Hkv,S,d), v (B,Hkv,S,dv)):
 *   dq (B,Hq,L,d) += dL/dq, dk (B,Hkv,S,d) += dL/dk, dv (B,Hkv,S,dv) += dL/dv
 *   (each may be NULL; with GQA dk/dv sum over the Hq/Hkv query heads of a
 *   group).  dout (B,Hq,L,dv) the upstream gradient.
 *   out (B,Hq,L,dv): the forward's output, or NULL (recomputed);
 *   lse (B,Hq,L): the forward's per-row log-sum-exp, or NULL (recomputed):
 *     lse[b,h,i] = log sum_j exp(s_ij), s_ij = scale q_i.k_j + mask bias,
 *     natural log, before dropout; -inf for a fully masked row.
 * q, k, v, dout, out and the gradients may each be MHA_F32, MHA_F16 or
 * MHA_BF16 (fp32 gradients for half inputs included): half tensors are
 * widened to float32 copies, the gradients computed in float32 (P and dS
 * not rounded) and a half gradient rounded once after the addition.
 * opt: as given to the forward (opt->attn_weights is ignored).  opt->kernel REF
 * runs the naive float64 reference (mha_attn_bwd_f32_ref); any other value
 * the fused flash-style backward (tiles recomputing P from lse). */
MHA_API mha_status mha_sdpa_backward(mha_tensor *dq, mha_tensor *dk, mha_tensor *dv,
                                     const mha_tensor *dout, const mha_tensor *out,
                                     const mha_tensor *lse, const mha_tensor *q,
                                     const mha_tensor *k, const mha_tensor *v,
                                     const mha_sdpa_options *opt);

/* Gradients of the nn.MultiheadAttention parameters, the same names and
 * shapes as mha_multihead_weights.  A NULL field is not wanted (it must be
 * NULL when the weight is absent; in_proj_weight's gradient when the
 * weights are packed, q/k/v_proj_weight's when they are separate). */
typedef struct mha_multihead_grads {
    mha_tensor *in_proj_weight;  /* (3E,E)                                  */
    mha_tensor *q_proj_weight;   /* (E,E)                                   */
    mha_tensor *k_proj_weight;   /* (E,kdim)                                */
    mha_tensor *v_proj_weight;   /* (E,vdim)                                */
    mha_tensor *in_proj_bias;    /* (3E)                                    */
    mha_tensor *out_proj_weight; /* (E,E)                                   */
    mha_tensor *out_proj_bias;   /* (E)                                     */
    mha_tensor *bias_k;          /* same shape as the weight: (E) or (1,1,E) */
    mha_tensor *bias_v;          /* same shape as the weight                */
} mha_multihead_grads;

/* THE SAVED STATE of one multi-head attention forward, for its backward:
 * a caller-owned buffer (float-aligned) of mha_multihead_saved_size()
 * bytes holding a small header (the dimensions, checked by the backward),
 * the projections qkv (B,R,3E) with R = max(L,S') (q | k | v, bias_k/bias_v
 * and the zero row appended as key rows S..S'-1), the merged attention
 * output (B,L,E) (the input of out_proj) and the per-head log-sum-exp
 * (B,H,L).  S' = S + bias_kv + add_zero_attn.  Put it in the activation
 * allocation of a training step; it stays valid while the inputs and
 * weights are unchanged. */
MHA_API mha_status mha_multihead_saved_size(int64_t B, int64_t L, int64_t S, int64_t E,
                                            int64_t H, int bias_kv, int add_zero_attn,
                                            size_t *bytes);

/* mha_multihead_forward that also fills `saved` (saved_bytes at least
 * mha_multihead_saved_size()).  Same arguments otherwise; averaged
 * attention weights (opt->attn_weights with average_attn_weights) are
 * MHA_ERR_UNSUPPORTED here (ask for per-head attn_weights or none). */
MHA_API mha_status mha_multihead_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                               const mha_tensor *query, const mha_tensor *key,
                                               const mha_tensor *value,
                                               const mha_multihead_weights *w,
                                               const mha_multihead_options *opt);

/* Bytes of workspace mha_multihead_backward needs (dqkv (B,R,3E) and dattn
 * (B,L,E)); same dimensions as the saved size.  The attention backward's
 * own per-thread scratch is still allocated inside the call. */
MHA_API mha_status mha_multihead_backward_workspace_size(int64_t B, int64_t L, int64_t S,
                                                         int64_t E, int64_t H, int bias_kv,
                                                         int add_zero_attn, size_t *bytes);

/* MultiheadAttention backward: with dout (B,L,E) (unbatched (L,E)),
 *   dquery (B,L,E) += dL/dquery, dkey (B,S,kdim) += dL/dkey,
 *   dvalue (B,S,vdim) += dL/dvalue, and dw's fields += dL/dweight.
 * saved: the buffer filled by mha_multihead_forward_train with the same
 * query/key/value/w/opt.  Self-attention (key and value the query's view):
 * dquery receives the sum of the three paths; dkey/dvalue must then be
 * NULL or dquery itself.  dkey and dvalue may be one view (decoder memory:
 * key == value): both paths add into it.  Any gradient may be NULL.
 * workspace: mha_multihead_backward_workspace_size() bytes, float-aligned,
 * or NULL (allocated inside). */
MHA_API mha_status mha_multihead_backward(mha_tensor *dquery, mha_tensor *dkey,
                                          mha_tensor *dvalue, const mha_multihead_grads *dw,
                                          const mha_tensor *dout, const void *saved,
                                          size_t saved_bytes, const mha_tensor *query,
                                          const mha_tensor *key, const mha_tensor *value,
                                          const mha_multihead_weights *w,
                                          const mha_multihead_options *opt, void *workspace,
                                          size_t workspace_bytes);

/* ---- Transformer-layer backward (src/norm.c, activation.c, mlp.c,
 * transformer.c; docs/training.md).  THE GRADIENT RULE above holds: every
 * gradient is ADDED into (+=), NULL skips it.  Row tensors are "(N,E)" as
 * in the forward section; gradients have their input's or weight's shape,
 * are contiguous and overlap no input. */

/* Linear: dx (N,K) += dout (N,F) weight; dweight (F,K) += dout^T x;
 * dbias (F) += column sums of dout. */
MHA_API mha_status mha_linear_backward(mha_tensor *dx, mha_tensor *dweight, mha_tensor *dbias,
                                       const mha_tensor *dout, const mha_tensor *x,
                                       const mha_tensor *weight);

/* LayerNorm / RMSNorm of x (N,E): the row statistics are recomputed from x
 * (no saved state).  weight (E) or NULL as in the forward; dweight/dbias (E). */
MHA_API mha_status mha_layernorm_backward(mha_tensor *dx, mha_tensor *dweight, mha_tensor *dbias,
                                          const mha_tensor *dout, const mha_tensor *x,
                                          const mha_tensor *weight, float eps);
MHA_API mha_status mha_rmsnorm_backward(mha_tensor *dx, mha_tensor *dweight,
                                        const mha_tensor *dout, const mha_tensor *x,
                                        const mha_tensor *weight, float eps);

/* dx += dout * act'(x), x the forward's input (ReLU'(0) = 0 as PyTorch). */
MHA_API mha_status mha_activation_backward(mha_tensor *dx, const mha_tensor *dout,
                                           const mha_tensor *x, mha_activation act);

/* out = x + y:  dx += dout, dy += dout (either may be NULL). */
MHA_API mha_status mha_residual_backward(mha_tensor *dx, mha_tensor *dy, const mha_tensor *dout);

/* dx += dout * keep / (1-p) with the forward's keep decisions (same p,
 * training, seed, stream); dx += dout when not dropping. */
MHA_API mha_status mha_dropout_backward(mha_tensor *dx, const mha_tensor *dout, float p,
                                        int training, uint64_t seed, uint64_t stream);

/* Gradients of an MLP's weights (NULL fields skipped). */
typedef struct mha_mlp_grads {
    mha_tensor *linear1_weight, *linear1_bias; /* (F,E), (F) */
    mha_tensor *linear2_weight, *linear2_bias; /* (E,F), (E) */
    mha_tensor *linear3_weight, *linear3_bias; /* (F,E), (F) */
} mha_mlp_grads;

/* MLP backward: the hidden layer is recomputed from x (N,E) (one GEMM, two
 * gated), so no saved state.  workspace: mha_mlp_backward_workspace_size()
 * bytes (6*N*F floats), float-aligned, or NULL (allocated inside). */
MHA_API mha_status mha_mlp_backward_workspace_size(int64_t N, int64_t F, int gated,
                                                   size_t *bytes);
MHA_API mha_status mha_mlp_backward(mha_tensor *dx, const mha_mlp_grads *grads,
                                    const mha_tensor *dout, const mha_tensor *x,
                                    const mha_mlp_weights *w, mha_activation act,
                                    void *workspace, size_t workspace_bytes);

/* Gradients of the layers, named as their weights (NULL fields skipped). */
typedef struct mha_encoder_layer_grads {
    mha_multihead_grads self_attn;
    mha_tensor *linear1_weight, *linear1_bias, *linear2_weight, *linear2_bias;
    mha_tensor *norm1_weight, *norm1_bias, *norm2_weight, *norm2_bias;
} mha_encoder_layer_grads;

typedef struct mha_decoder_layer_grads {
    mha_multihead_grads self_attn, multihead_attn;
    mha_tensor *linear1_weight, *linear1_bias, *linear2_weight, *linear2_bias;
    mha_tensor *norm1_weight, *norm1_bias, *norm2_weight, *norm2_bias;
    mha_tensor *norm3_weight, *norm3_bias;
} mha_decoder_layer_grads;

/* THE SAVED STATE of one layer's training forward: a caller buffer
 * (float-aligned) of mha_layer_saved_size() bytes holding the residual
 * stream at each sublayer boundary (N,E) x 5 and the attention modules'
 * saved states.  S = L for the encoder.  `workspace` of the train/backward
 * calls: mha_layer_train_workspace_size() bytes or NULL (allocated). */
MHA_API mha_status mha_layer_saved_size(int64_t B, int64_t L, int64_t S, int64_t E, int64_t H,
                                        size_t *bytes);
MHA_API mha_status mha_layer_train_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E,
                                                  int64_t F, int64_t H, size_t *bytes);

/* The forward of mha_encoder_layer_forward / mha_decoder_layer_forward that
 * also fills `saved`; out must not overlap src/tgt here. */
MHA_API mha_status mha_encoder_layer_forward_train(mha_tensor *out, void *saved,
                                                   size_t saved_bytes, const mha_tensor *src,
                                                   const mha_encoder_layer_weights *w,
                                                   const mha_layer_masks *masks,
                                                   const mha_layer_options *opt, void *workspace,
                                                   size_t workspace_bytes);
MHA_API mha_status mha_decoder_layer_forward_train(mha_tensor *out, void *saved,
                                                   size_t saved_bytes, const mha_tensor *tgt,
                                                   const mha_tensor *memory,
                                                   const mha_decoder_layer_weights *w,
                                                   const mha_layer_masks *masks,
                                                   const mha_layer_options *opt, void *workspace,
                                                   size_t workspace_bytes);

/* Layer backward: dsrc/dtgt (B,L,E) += dL/dinput, dmemory (B,S,E) +=
 * dL/dmemory, grads += dL/dweights, from dout (B,L,E) and the saved state of
 * the forward_train call with the same inputs, weights, masks and options. */
MHA_API mha_status mha_encoder_layer_backward(mha_tensor *dsrc,
                                              const mha_encoder_layer_grads *grads,
                                              const mha_tensor *dout, const void *saved,
                                              size_t saved_bytes, const mha_tensor *src,
                                              const mha_encoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes);
MHA_API mha_status mha_decoder_layer_backward(mha_tensor *dtgt, mha_tensor *dmemory,
                                              const mha_decoder_layer_grads *grads,
                                              const mha_tensor *dout, const void *saved,
                                              size_t saved_bytes, const mha_tensor *tgt,
                                              const mha_tensor *memory,
                                              const mha_decoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes);

/* Stacks (nn.TransformerEncoder / Decoder): every layer's saved state plus
 * its output, then the final norm.  grads->layers: num_layers entries (or
 * NULL); norm_weight/norm_bias: the final norm's gradients (NULL skips).
 * The decoder's dmemory receives the sum over the layers.  workspace:
 * mha_stack_train_workspace_size() bytes (F the widest layer's) or NULL. */
typedef struct mha_encoder_grads {
    const mha_encoder_layer_grads *layers;
    mha_tensor *norm_weight, *norm_bias;
} mha_encoder_grads;

typedef struct mha_decoder_grads {
    const mha_decoder_layer_grads *layers;
    mha_tensor *norm_weight, *norm_bias;
} mha_decoder_grads;

MHA_API mha_status mha_stack_saved_size(int64_t num_layers, int64_t B, int64_t L, int64_t S,
                                        int64_t E, int64_t H, size_t *bytes);
MHA_API mha_status mha_stack_train_workspace_size(int64_t B, int64_t L, int64_t S, int64_t E,
                                                  int64_t F, int64_t H, size_t *bytes);
MHA_API mha_status mha_encoder_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                             const mha_tensor *src, const mha_encoder_weights *w,
                                             const mha_layer_masks *masks,
                                             const mha_layer_options *opt, void *workspace,
                                             size_t workspace_bytes);
MHA_API mha_status mha_decoder_forward_train(mha_tensor *out, void *saved, size_t saved_bytes,
                                             const mha_tensor *tgt, const mha_tensor *memory,
                                             const mha_decoder_weights *w,
                                             const mha_layer_masks *masks,
                                             const mha_layer_options *opt, void *workspace,
                                             size_t workspace_bytes);
MHA_API mha_status mha_encoder_backward(mha_tensor *dsrc, const mha_encoder_grads *grads,
                                        const mha_tensor *dout, const void *saved,
                                        size_t saved_bytes, const mha_tensor *src,
                                        const mha_encoder_weights *w, const mha_layer_masks *masks,
                                        const mha_layer_options *opt, void *workspace,
                                        size_t workspace_bytes);
MHA_API mha_status mha_decoder_backward(mha_tensor *dtgt, mha_tensor *dmemory,
                                        const mha_decoder_grads *grads, const mha_tensor *dout,
                                        const void *saved, size_t saved_bytes,
                                        const mha_tensor *tgt, const mha_tensor *memory,
                                        const mha_decoder_weights *w, const mha_layer_masks *masks,
                                        const mha_layer_options *opt, void *workspace,
                                        size_t workspace_bytes);

/* ------------------------------------------------------------------------ */
/* Training: AdamW and gradient clipping (src/optim.c, docs/training.md)    */
/* ------------------------------------------------------------------------ */

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 1e-2; max_grad_norm <= 0 turns clipping off. */
typedef struct mha_adamw_options {
    double lr, beta1, beta2, eps, weight_decay;
    double max_grad_norm;       /* clip_grad_norm_ before each step, or <= 0 */
} mha_adamw_options;

MHA_API void mha_adamw_options_init(mha_adamw_options *opt);

/* The optimiser state: the two moment buffers, ONE allocation of n floats
 * each (exp_avg m, exp_avg_sq v, PyTorch's names), and the step count.
 * The caller owns the parameter and gradient blocks (n floats each, one
 * allocation each, llm.c style), so a step is one flat loop. */
typedef struct mha_adamw {
    mha_adamw_options opt;
    int64_t n;                  /* parameters                              */
    int64_t step;               /* steps taken (PyTorch's state['step'])    */
    float *m, *v;               /* (n) each                                */
} mha_adamw;

/* Allocates zeroed moments for n parameters into the caller's *a; free
 * them with mha_adamw_free (accepts a zeroed or freed *a). */
MHA_API mha_status mha_adamw_create(mha_adamw *a, int64_t n, const mha_adamw_options *opt);
MHA_API void mha_adamw_free(mha_adamw *a);

/* One step, exactly torch.optim.AdamW (1.13, foreach=False): clips grads in
 * place when opt.max_grad_norm > 0 (torch.nn.utils.clip_grad_norm_), then
 * updates params (n) in place.  *grad_norm (may be NULL) receives the
 * gradient's global 2-norm before clipping. */
MHA_API mha_status mha_adamw_step(mha_adamw *a, float *params, float *grads, double *grad_norm);

/* clip_grad_norm_ alone: *norm = ||grads||_2 (summed in double); grads *=
 * max_norm / (norm + 1e-6) when that is < 1 and max_norm > 0. */
MHA_API mha_status mha_grad_clip_norm(float *grads, int64_t n, double max_norm, double *norm);

/* ---- A small Transformer to train (src/model.c, docs/training.md) ------
 * Token + positional embeddings, `layers` encoder layers (bidirectional, or
 * causal = a decoder-only stack), a final LayerNorm when norm_first, and a
 * Linear head to `vocab` logits; loss = mean cross-entropy.  Parameters,
 * gradients and activations are one allocation each.  Tensor names are the
 * state_dict of the PyTorch module in docs/training.md (tok_emb.weight,
 * pos_emb.weight, encoder.layers.N.*, encoder.norm.*, head.weight/bias). */
typedef struct mha_model_config {
    int64_t vocab;              /* V tokens                                  */
    int64_t max_len;            /* positions, T <= max_len                   */
    int64_t dim, heads, ffn;    /* E, H (divides E), F                       */
    int64_t layers;             /* >= 1                                      */
    mha_causal causal;          /* TOP_LEFT: decoder-only; NONE or TOP_LEFT  */
    int norm_first;             /* 1: pre-norm + final norm (default)        */
    mha_activation activation;  /* default GELU                              */
    float dropout;              /* every dropout of the layers, default 0    */
    float layer_norm_eps;       /* default 1e-5                              */
} mha_model_config;

typedef struct mha_model mha_model;

/* Defaults: V 12, max_len 12, E 64, H 4, F 128, 2 layers, pre-norm, GELU. */
MHA_API void mha_model_config_init(mha_model_config *cfg);

/* A model with PyTorch's initialisers (distributions, not draws) from seed. */
MHA_API mha_status mha_model_create(mha_model **model, const mha_model_config *cfg,
                                    uint64_t seed);
MHA_API void mha_model_free(mha_model *model);
MHA_API const mha_model_config *mha_model_get_config(const mha_model *model);

/* The parameter and gradient blocks (n floats each, tensor after tensor in
 * state_dict order) and the i-th tensor's name and views into both. */
MHA_API int64_t mha_model_num_params(const mha_model *model);
MHA_API float *mha_model_params(mha_model *model);
MHA_API float *mha_model_grads(mha_model *model);
MHA_API int64_t mha_model_num_tensors(const mha_model *model);
MHA_API mha_status mha_model_tensor(const mha_model *model, int64_t i, const char **name,
                                    mha_tensor *param, mha_tensor *grad);

/* Forward of tokens (B,T) (values 0..V-1), row-major.  targets (B,T) or
 * NULL; -1 = ignored.  *loss (may be NULL) = mean cross-entropy over the
 * targets >= 0.  training != 0 applies the dropouts, whose keep decisions
 * come from step_seed.  Keeps what the backward needs. */
MHA_API mha_status mha_model_forward(mha_model *model, const int64_t *tokens,
                                     const int64_t *targets, int64_t B, int64_t T, int training,
                                     uint64_t step_seed, float *loss);
/* Logits (B,T,V) of the last forward, valid until the next forward. */
MHA_API const float *mha_model_logits(const mha_model *model);
/* Backward of the last forward's loss: gradients ADDED into the block. */
MHA_API mha_status mha_model_backward(mha_model *model);
MHA_API void mha_model_zero_grad(mha_model *model);

/* Checkpoint: the parameters as safetensors under their state_dict names
 * with "__metadata__" {step, seed, format, the config}; when optim_path is
 * given, AdamW's state beside it: exp_avg.<name>, exp_avg_sq.<name> and
 * {step, seed, lr, beta1, beta2, eps, weight_decay, max_grad_norm}. */
MHA_API mha_status mha_model_save(const mha_model *model, const char *path,
                                  const char *optim_path, const mha_adamw *opt, int64_t step,
                                  uint64_t seed);
/* What a checkpoint records about its run beside the weights. */
typedef struct mha_checkpoint_info {
    int64_t step;                  /* optimiser steps taken                   */
    uint64_t seed;
    uint64_t run_id;               /* random per fresh run, kept across resumes
                                      ("run_id", 16 hex digits; 0: none)     */
    int64_t n_extra;               /* more "__metadata__" pairs for the model
                                      file (the CLI stores its run flags)    */
    const char *const *extra_keys; /* n_extra keys, not the built-in ones    */
    const char *const *extra_values;
} mha_checkpoint_info;
/* mha_model_save with a run id and extra metadata.  The model and optimiser
 * files are one unit: both carry the step and run id; both are written to
 * temporaries and synced, then renamed (optimiser first), so a failure
 * changes neither file and an interrupted save leaves a pair that
 * mha_model_open refuses. */
MHA_API mha_status mha_model_save_checkpoint(const mha_model *model, const char *path,
                                             const char *optim_path, const mha_adamw *opt,
                                             const mha_checkpoint_info *info);
/* Rebuilds a model from a checkpoint (and, with optim_path, initialises
 * *opt, which must not hold an allocation, with the saved moments, step
 * and options).  *step / *seed (may be NULL) from the metadata.  Every
 * tensor's presence, dtype and shape is checked against the files before
 * the model is allocated; with optim_path the two files must carry the
 * same step and run id (MHA_ERR_FORMAT naming both files and values). */
MHA_API mha_status mha_model_open(mha_model **model, const char *path, const char *optim_path,
                                  mha_adamw *opt, int64_t *step, uint64_t *seed);

/* ---- Sentence embeddings from a trained BERT (src/bert.c, docs/models.md)
 * A sentence-transformers directory (all-MiniLM-L6-v2 and any BERT-
 * architecture model with mean or CLS pooling): config.json (BertModel
 * sizes), modules.json (Transformer, Pooling, optional Normalize),
 * 1_Pooling/config.json, sentence_bert_config.json (max_seq_length) and
 * model.safetensors in Hugging Face BertModel names, mapped (not copied).
 * The model takes token ids (from the tokenizer below or any WordPiece
 * tokenizer with [CLS] ... [SEP]); every id is a real token: attention and
 * pooling never look at id values (a typed [PAD], id 0, is attended).
 * Letters: T tokens of all texts packed, n texts, D hidden width, H heads,
 * L one text's length. */
typedef enum mha_bert_pooling {
    MHA_BERT_POOL_MEAN = 0, /* mean of the text's token vectors             */
    MHA_BERT_POOL_CLS = 1   /* the first token's ([CLS]) vector             */
} mha_bert_pooling;

typedef struct mha_bert_info {
    int64_t hidden;          /* D, config hidden_size                         */
    int64_t heads;           /* H, num_attention_heads (divides D)            */
    int64_t layers;          /* num_hidden_layers                             */
    int64_t intermediate;    /* intermediate_size (the MLP width)             */
    int64_t vocab;           /* vocab_size: ids are 0..vocab-1                 */
    int64_t max_positions;   /* max_position_embeddings: L <= this            */
    int64_t max_seq_length;  /* sentence_bert_config.json (else max_positions) */
    int64_t type_vocab;      /* type_vocab_size (every token is type 0)        */
    float layer_norm_eps;
    mha_bert_pooling pooling;
    int normalize;           /* 1: outputs are L2-normalised (Normalize module) */
} mha_bert_info;

typedef struct mha_bert mha_bert;

/* Loads the model in model_dir; every tensor's presence, dtype and shape is
 * checked against config.json before use.  MHA_ERR_IO for a missing file,
 * MHA_ERR_FORMAT for a corrupt one or a config that disagrees with the
 * tensors, MHA_ERR_UNSUPPORTED for what mha does not run (another
 * architecture or activation, max pooling, extra modules, a build without
 * libcjson); the message names the file and the field. */
MHA_API mha_status mha_bert_open(mha_bert **model, const char *model_dir);
MHA_API void mha_bert_free(mha_bert *model);
MHA_API const mha_bert_info *mha_bert_get_info(const mha_bert *model);

/* out (n,D) = the embeddings of n texts given packed: text i is
 * ids[offsets[i] .. offsets[i+1]) (offsets has n+1 entries, offsets[0] = 0,
 * each text 1..max_positions ids, each id < vocab).  Texts are not padded:
 * the cost is the sum of their lengths.  Row i of out depends only on text
 * i (bit-identical for any batch it is embedded in and any thread count).
 * One call at a time per model (it keeps its workspace). */
MHA_API mha_status mha_bert_embed(mha_bert *model, mha_tensor *out, const int32_t *ids,
                                  const int64_t *offsets, int64_t n);

/* hidden (L,D) = the input of encoder layer `layer` for one text of L ids
 * (layer 0: the embeddings after their LayerNorm; layer == layers: the
 * last layer's output).  For inspection (mha demo). */
MHA_API mha_status mha_bert_hidden(mha_bert *model, mha_tensor *hidden, const int32_t *ids,
                                   int64_t L, int64_t layer);

/* attn_weights (H,L,L) = the attention probabilities of every head of encoder
 * layer `layer` (0-based) for one text of L ids (mha viz --model). */
MHA_API mha_status mha_bert_attention(mha_bert *model, mha_tensor *attn_weights, const int32_t *ids,
                                      int64_t L, int64_t layer);

/* ------------------------------------------------------------------------ */
/* Files                                                                     */
/* ------------------------------------------------------------------------ */

/* Reads a .npy file (versions 1.0-3.0, little-endian, C order; dtypes
 * <f4 <f8 <f2 <u2 |b1 |u1 <i4 <i8).  want = MHA_F32 converts numbers to float;
 * want = MHA_F16 / MHA_BF16 round to half (nearest even; a file already of
 * that dtype is copied as is); want = MHA_BOOL converts to boolean
 * (nonzero = true); want = MHA_I64 converts integers.  <u2 is raw bfloat16
 * bits (NumPy has no bfloat16 dtype; tools save bf16.view(np.uint16)): it
 * reads as bfloat16 for every float want and is refused for MHA_I64.
 * The result is owned: free with mha_tensor_free(). */
MHA_API mha_status mha_npy_load(mha_tensor *out, const char *path, mha_dtype want);

/* As mha_npy_load, but keeps the file's kind: floats become MHA_F32,
 * bool/u1/i4/i8 become MHA_BOOL when as_mask is set, else ints MHA_I64.
 * *file_dtype (may be NULL) says what the file held: MHA_F32 for <f4 and
 * <f8, MHA_F16 for <f2, MHA_BF16 for <u2, MHA_BOOL, MHA_I64 for ints. */
MHA_API mha_status mha_npy_load_any(mha_tensor *out, mha_dtype *file_dtype, const char *path,
                                    int as_mask);

/* Writes t (MHA_F32, MHA_F16, MHA_BF16 or MHA_BOOL; any strides) as .npy
 * version 1.0, byte-identical to numpy.save.  A float t is written as any
 * float dtype `as`, each value rounded once (nearest even): MHA_F32 as <f4,
 * MHA_F16 as <f2, MHA_BF16 as <u2 raw bits; MHA_BOOL only as |b1. */
MHA_API mha_status mha_npy_save(const mha_tensor *t, const char *path, mha_dtype as);

/* safetensors files (https://github.com/huggingface/safetensors), read with
 * the format's safety rules enforced (header <= 100 MB, offsets contiguous,
 * inside the data section and equal to shape x dtype size, no duplicate
 * names, every product overflow-checked; see docs/formats.md).  The file
 * is mapped when possible.  Tensors of up to MHA_SAFETENSORS_MAX_DIMS dims
 * are listed; those of up to MHA_MAX_DIMS can be loaded. */
#define MHA_SAFETENSORS_MAX_DIMS 8
typedef struct mha_safetensors mha_safetensors;

MHA_API mha_status mha_safetensors_open(mha_safetensors **st, const char *path);
MHA_API void mha_safetensors_free(mha_safetensors *st);

/* Tensors in file order (order of the header's keys), 0 <= i < count. */
MHA_API int64_t mha_safetensors_count(const mha_safetensors *st);
MHA_API const char *mha_safetensors_name(const mha_safetensors *st, int64_t i);
/* Index of a tensor by name, or -1. */
MHA_API int64_t mha_safetensors_find(const mha_safetensors *st, const char *name);
/* dtype as in the file ("F32", "BF16", ...), rank and sizes (any pointer may
 * be NULL; shape holds MHA_SAFETENSORS_MAX_DIMS entries). */
MHA_API mha_status mha_safetensors_info(const mha_safetensors *st, int64_t i, const char **dtype,
                                        int *ndim, int64_t *shape);

/* An owned float32 copy of a tensor (F32, F16, BF16, F64 and the integer
 * and BOOL dtypes are converted); free with mha_tensor_free(). */
MHA_API mha_status mha_safetensors_get_f32(const mha_safetensors *st, const char *name,
                                           mha_tensor *out);
/* A float32 view valid until mha_safetensors_free(): into the mapping when
 * the tensor is F32 and 4-byte aligned, otherwise a converted copy kept by st. */
MHA_API mha_status mha_safetensors_view_f32(mha_safetensors *st, const char *name,
                                            mha_tensor *view);
/* A view in the tensor's own dtype (F32 -> MHA_F32, F16 -> MHA_F16, BF16 ->
 * MHA_BF16; others MHA_ERR_DTYPE), valid until mha_safetensors_free() and
 * read-only.  Zero-copy: data points into the mapping whenever the file is
 * mapped and the tensor's bytes are aligned to its element size (2 bytes
 * for F16/BF16, 4 for F32; files written by safetensors and by mha always
 * are); otherwise it is an aligned copy kept by st.  Half views feed the
 * kernels that take half tensors (mha_sdpa_forward's q, k, v) directly. */
MHA_API mha_status mha_safetensors_view(mha_safetensors *st, const char *name, mha_tensor *view);

/* The "__metadata__" string map: count, i-th key and value, or lookup by
 * key (NULL when absent). */
MHA_API int64_t mha_safetensors_metadata_count(const mha_safetensors *st);
MHA_API const char *mha_safetensors_metadata_key(const mha_safetensors *st, int64_t i);
MHA_API const char *mha_safetensors_metadata_value(const mha_safetensors *st, int64_t i);
MHA_API const char *mha_safetensors_metadata(const mha_safetensors *st, const char *key);

/* Writes n tensors (MHA_F32 as "F32", MHA_F16 "F16", MHA_BF16 "BF16", MHA_BOOL
 * "BOOL", MHA_I64 "I64"; any strides) under names, plus n_meta metadata pairs (may be 0,
 * keys/values NULL).  Names must be unique and not "__metadata__". */
MHA_API mha_status mha_safetensors_write(const char *path, const char *const *names,
                                         const mha_tensor *const *tensors, int64_t n,
                                         const char *const *meta_keys,
                                         const char *const *meta_values, int64_t n_meta);

/* ------------------------------------------------------------------------ */
/* Text: WordPiece tokenizer (src/text/, docs/models.md "Tokenizer")         */
/* ------------------------------------------------------------------------ */

/* A BERT tokenizer read from a Hugging Face tokenizer.json, giving the ids
 * the `tokenizers` library gives: added (special) tokens matched in the raw
 * text, case-sensitively, anywhere ("foo[MASK]bar"); BertNormalizer
 * (clean_text, handle_chinese_chars, strip_accents, lowercase);
 * BertPreTokenizer; WordPiece; the TemplateProcessing or BertProcessing
 * post-processor ([CLS] ... [SEP]).  The file's "truncation" and "padding"
 * blocks are ignored (max_length is the caller's, as sentence-transformers
 * overrides them).  Immutable once opened: concurrent encodes are safe. */
typedef struct mha_tokenizer mha_tokenizer;

/* Loads tokenizer.json.  Components other than the ones above (BPE,
 * Unigram, other normalizers, normalized/lstrip/rstrip/single_word added
 * tokens) are refused with MHA_ERR_UNSUPPORTED naming them, as is every
 * file when the build lacks libcjson or utf8proc; a file that is not JSON,
 * or whose fields have the wrong type or ids outside the vocab, is
 * MHA_ERR_FORMAT; an unreadable one MHA_ERR_IO.  *tok is NULL on failure.
 * Free with mha_tokenizer_free (accepts NULL). */
MHA_API mha_status mha_tokenizer_open(mha_tokenizer **tok, const char *tokenizer_json_path);
MHA_API void mha_tokenizer_free(mha_tokenizer *tok);

/* Tokenizes text[0..len) (UTF-8; NUL bytes are data, not an end; bytes
 * that are not UTF-8 count as U+FFFD, which clean_text deletes) into
 * ids[0..*n) = the post-processor's head ([CLS]), the text's tokens, its
 * tail ([SEP]).  max_length > 0 truncates to that many ids in all, keeping
 * the first max_length - mha_tokenizer_num_special() tokens (as
 * sentence-transformers does with max_seq_length); max_length <= 0 keeps
 * everything; 0 < max_length < num_special is MHA_ERR_VALUE.  An empty or
 * blank text gives the specials alone ([CLS] [SEP]).  When capacity is
 * less than the ids needed, nothing is written, *n is the need and the
 * status MHA_ERR_SHAPE (ids may be NULL with capacity 0 to ask).  A typed
 * "[PAD]" is a real token (id 0 for BERT): never derive an attention mask
 * from id == 0. */
MHA_API mha_status mha_tokenizer_encode(const mha_tokenizer *tok, const char *text, size_t len,
                                        int64_t max_length, int32_t *ids, int64_t capacity,
                                        int64_t *n);

/* V: ids are 0..V-1 (0 for NULL). */
MHA_API int64_t mha_tokenizer_vocab_size(const mha_tokenizer *tok);
/* The token of an id ("hello", "##ing", "[CLS]"), owned by tok; NULL if out
 * of range. */
MHA_API const char *mha_tokenizer_id_to_token(const mha_tokenizer *tok, int32_t id);
/* The id of a vocab token (exact bytes), or -1. */
MHA_API int32_t mha_tokenizer_token_to_id(const mha_tokenizer *tok, const char *token);
/* Ids the post-processor adds around every text (2 for BERT). */
MHA_API int64_t mha_tokenizer_num_special(const mha_tokenizer *tok);

/* Safe file output: every file mha writes (.npy, safetensors, checkpoints)
 * goes through this writer, and programs may use it for their own files.
 * A regular-file target (or a new path) is written to a temporary beside
 * it, flushed, fsynced and renamed over it, then the directory is fsynced,
 * so the path holds either the old file or the complete new one and a
 * reader mapping the old file keeps its bytes.  A symlink to a regular file
 * is written through (the file it names is replaced; the link stays).  A
 * non-regular target (device, FIFO, terminal) or a path under /dev/ or
 * /proc/ is written directly.  A failure removes only the temporary; the
 * target is never deleted.  See docs/formats.md, "Writing files".
 *
 *   mha_safe_file *f;
 *   if (mha_safe_file_open(&f, path) == MHA_OK) {
 *       fprintf(mha_safe_file_stream(f), "...");
 *       st = mha_safe_file_close(f, 1);      // MHA_ERR_IO when any step failed
 *   }
 */
typedef struct mha_safe_file mha_safe_file;
MHA_API mha_status mha_safe_file_open(mha_safe_file **f, const char *path);
/* The file's buffered stdio stream (valid until mha_safe_file_close). */
MHA_API FILE *mha_safe_file_stream(mha_safe_file *f);
/* keep = 1: finishes the file (flush, fsync, rename); MHA_ERR_IO naming the
 * path when a write or any later step failed.  keep = 0: abandons it.
 * Either way f is freed and the temporary is gone.  NULL: no-op. */
MHA_API mha_status mha_safe_file_close(mha_safe_file *f, int keep);

#ifdef __cplusplus
}
#endif
#endif /* MHA_H */
