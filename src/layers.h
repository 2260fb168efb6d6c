/* layers.h - private interface shared by the Transformer-layer files
 * (norm.c, activation.c, mlp.c, transformer.c, transformer_train.c); never
 * installed.
 *
 * Letter legend: N rows (B*L), E model width, F MLP hidden width.
 * Every kernel here has a float32 path and a float64 reference with the
 * same arguments (the reference is for the tests).
 */
#ifndef MHA_LAYERS_H
#define MHA_LAYERS_H

#include "internal.h"

/* A contiguous float32 row tensor: rank 1..4, read as N rows of its last
 * dimension E.  want_E < 0 accepts any width. */
mha_status mha_rows_check(const mha_tensor *t, const char *name, int64_t want_E, int64_t *N,
                          int64_t *E);

/* out is x itself (in place) or does not overlap it; same row shape. */
mha_status mha_rows_check_out(const mha_tensor *out, const mha_tensor *x, const char *name,
                              int64_t N, int64_t E, bool allow_same);

/* An optional float32 vector (n), contiguous, any leading 1-dims.  NULL ok. */
mha_status mha_vector_check(const mha_tensor *t, const char *name, int64_t n);

/* A float32 (rows, cols) matrix contiguous in its last dim; cols from *cols
 * when >= 0, else read into *cols. */
mha_status mha_matrix_check(const mha_tensor *t, const char *name, int64_t rows, int64_t *cols);

static inline const float *mha_fdata(const mha_tensor *t) {
    return t ? (const float *)t->data : NULL;
}
/* A gradient's data, NULL for a NULL (not wanted) gradient. */
static inline float *mha_gdata(mha_tensor *t) { return t ? (float *)t->data : NULL; }

/* ---- norms (norm.c): y (N,E) from x (N,E); w, b (E) or NULL; y may be x. */
void mha_layernorm_f32(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps);
void mha_layernorm_ref(float *y, const float *x, int64_t N, int64_t E, const float *w,
                       const float *b, float eps);
/* One LayerNorm output of mha_layernorm_f32's plan: x centred and scaled in
 * double, then weight w[c] and bias b[c] (either NULL) in float. */
static inline float mha_layernorm_value(float x, double mean, double rstd, const float *w,
                                        const float *b, int64_t c) {
    float v = (float)((x - mean) * rstd); /* a float mean loses digits when |mean| >> std */
    if (w)
        v *= w[c];
    if (b)
        v += b[c];
    return v;
}
/* mha_layernorm_f32's plan with AVX2 (src/kernels/norm_avx2.c), one thread;
 * only after a CPU check. */
void mha_layernorm_f32_avx2(float *y, const float *x, int64_t N, int64_t E, const float *w,
                            const float *b, float eps);
/* The same plan with AVX-512 (src/kernels/norm_avx512.c), one thread:
 * taken only by mha_layernorm_f32_avx512 with MHA_AVX512_PICK. */
typedef void (*mha_layernorm_fn)(float *y, const float *x, int64_t N, int64_t E, const float *w,
                                 const float *b, float eps);
MHA_AVX512_DECLARE(mha_layernorm_fn, mha_layernorm_avx512_loop);
/* MHA_ERR_UNSUPPORTED (naming AVX-512, y untouched) unless mha_avx512_runs(). */
mha_status mha_layernorm_f32_avx512(float *y, const float *x, int64_t N, int64_t E,
                                    const float *w, const float *b, float eps);
void mha_rmsnorm_f32(float *y, const float *x, int64_t N, int64_t E, const float *w, float eps);
void mha_rmsnorm_ref(float *y, const float *x, int64_t N, int64_t E, const float *w, float eps);

/* ---- elementwise (activation.c): n elements, y may be x. */
void mha_activation_f32(float *y, const float *x, int64_t n, mha_activation act);
double mha_activation_ref(double x, mha_activation act);
/* y = x * keep / (1-p), keep from (seed, stream, index); p in (0,1). */
void mha_dropout_f32(float *y, const float *x, int64_t n, float p, uint64_t seed,
                     uint64_t stream);
/* True when flat element `index` of stream `stream` survives dropout p. */
bool mha_dropout_keep(uint64_t seed, uint64_t stream, int64_t index, float p);

/* ---- MLP (mlp.c) ---------------------------------------------------------- */

/* Validated raw MLP: weights contiguous, F hidden width, gated with w3. */
typedef struct mha_mlp_raw {
    int64_t E, F;
    const float *w1, *b1, *w2, *b2, *w3, *b3; /* w1,w3 (F,E) w2 (E,F) */
} mha_mlp_raw;

/* Checks w against width E and fills raw. */
mha_status mha_mlp_resolve(const mha_mlp_weights *w, int64_t E, mha_mlp_raw *raw);

/* Floats of hidden workspace for N rows. */
int64_t mha_mlp_hidden_floats(int64_t N, int64_t F, bool gated);

/* y (N,E) = MLP(x (N,E)), hidden: mha_mlp_hidden_floats floats.  Dropout
 * on the hidden activations when dropout_p > 0 (stream `stream`). */
void mha_mlp_f32(float *y, const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act,
                 float *hidden, float dropout_p, uint64_t seed, uint64_t stream);
/* The float64 reference of the same (no dropout). */
void mha_mlp_ref(float *y, const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act);

/* ---- backward passes ------------------------------------------------------
 * Argument order (llm.c): outputs (the gradients), saved state, inputs
 * (dout first, then the forward's inputs), weights, sizes.  Every gradient
 * ACCUMULATES (+=) into its buffer; the caller zeroes.  A NULL gradient
 * pointer skips that gradient.  Each f32 kernel has a float64 _ref twin with
 * the same arguments.  Reductions over rows run serially or per output
 * element, so the results never depend on the thread count. */

/* Linear y (N,F) = x (N,K) w^T + b:  dx (N,K) += dout w,  dw (F,K) +=
 * dout^T x,  db (F) += column sums of dout. */
void mha_linear_backward_f32(float *dx, float *dw, float *db, const float *dout, const float *x,
                             const float *w, int64_t N, int64_t F, int64_t K);
void mha_linear_backward_ref(float *dx, float *dw, float *db, const float *dout, const float *x,
                             const float *w, int64_t N, int64_t F, int64_t K);

/* LayerNorm / RMSNorm: the row statistics are recomputed from x (N,E). */
void mha_layernorm_backward_f32(float *dx, float *dw, float *db, const float *dout,
                                const float *x, const float *w, int64_t N, int64_t E, float eps);
void mha_layernorm_backward_ref(float *dx, float *dw, float *db, const float *dout,
                                const float *x, const float *w, int64_t N, int64_t E, float eps);
void mha_rmsnorm_backward_f32(float *dx, float *dw, const float *dout, const float *x,
                              const float *w, int64_t N, int64_t E, float eps);
void mha_rmsnorm_backward_ref(float *dx, float *dw, const float *dout, const float *x,
                              const float *w, int64_t N, int64_t E, float eps);

/* dx (n) += dout * act'(x). */
void mha_activation_backward_f32(float *dx, const float *dout, const float *x, int64_t n,
                                 mha_activation act);
/* act'(x) in float64 (ReLU'(0) = 0, as torch's threshold_backward). */
double mha_activation_grad_ref(double x, mha_activation act);

/* dx (n) += dout * keep / (1-p), the keep decisions of the forward. */
void mha_dropout_backward_f32(float *dx, const float *dout, int64_t n, float p, uint64_t seed,
                              uint64_t stream);

/* Gradients of an MLP's weights, raw (NULL = skip). */
typedef struct mha_mlp_raw_grads {
    float *w1, *b1, *w2, *b2, *w3, *b3; /* w1,w3 (F,E) w2 (E,F) */
} mha_mlp_raw_grads;

/* Floats of workspace mha_mlp_backward_f32 needs for N rows. */
int64_t mha_mlp_backward_floats(int64_t N, int64_t F, bool gated);

/* Backward of mha_mlp_f32 (same dropout arguments); the hidden layer is
 * recomputed from x into ws (mha_mlp_backward_floats floats). */
void mha_mlp_backward_f32(float *dx, const mha_mlp_raw_grads *g, const float *dout,
                          const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act,
                          float *ws, float dropout_p, uint64_t seed, uint64_t stream);
/* The float64 reference (no dropout). */
void mha_mlp_backward_ref(float *dx, const mha_mlp_raw_grads *g, const float *dout,
                          const float *x, int64_t N, const mha_mlp_raw *m, mha_activation act);

/* ---- the Transformer layers' shared steps (transformer.c; the training half
 * in transformer_train.c and the decoder's decode step use them too) ---------
 * A layer is a list of blocks, each a sublayer with the norm that goes with
 * it (normK of PyTorch's layer is block K-1):
 *   encoder  self attention, MLP;   decoder  self attention, cross, MLP.
 * Dropout streams (16 per layer, mha_layer_stream): an attention block k
 * drops its output on stream k; the MLP block k drops its hidden units on
 * stream k and its output on stream k + 1 (encoder 0 | 1, 2; decoder 0 | 1 |
 * 2, 3), as they have always been. */
typedef struct mha_layer_block {
    const mha_multihead_weights *attn;         /* NULL: the MLP block        */
    bool cross;                                /* attention over memory (S)  */
    const mha_tensor *norm_weight, *norm_bias; /* (E) or NULL each           */
} mha_layer_block;

typedef struct mha_layer_parts {
    int n;                     /* blocks: 2 (encoder) or 3 (decoder)         */
    mha_layer_block block[3];
    mha_mlp_raw mlp;           /* the MLP block's weights, F hidden width    */
} mha_layer_parts;

/* A stack (nn.TransformerEncoder / Decoder) seen as one: exactly one of
 * enc and dec is set. */
typedef struct mha_layer_stack {
    int64_t num_layers;
    const mha_encoder_layer_weights *enc; /* num_layers entries, or NULL    */
    const mha_decoder_layer_weights *dec; /* num_layers entries, or NULL    */
    int final_norm;
    const mha_tensor *norm_weight, *norm_bias; /* (E) or NULL each          */
} mha_layer_stack;

/* The stack view of an encoder's / a decoder's weights (w not NULL). */
mha_layer_stack mha_layer_stack_encoder(const mha_encoder_weights *w);
mha_layer_stack mha_layer_stack_decoder(const mha_decoder_weights *w);

/* A layer's blocks, unchecked (p->mlp is not set). */
void mha_layer_blocks_encoder(const mha_encoder_layer_weights *w, mha_layer_parts *p);
void mha_layer_blocks_decoder(const mha_decoder_layer_weights *w, mha_layer_parts *p);
/* Checks one layer's weights against width E and lays them out as blocks. */
mha_status mha_layer_parts_encoder(const mha_encoder_layer_weights *w, int64_t E,
                                   mha_layer_parts *p);
mha_status mha_layer_parts_decoder(const mha_decoder_layer_weights *w, int64_t E,
                                   mha_layer_parts *p);
/* Layer l of a stack as blocks. */
mha_status mha_layer_stack_parts(const mha_layer_stack *s, int64_t l, int64_t E,
                                 mha_layer_parts *p);
/* Checks every layer of s against width E; *F = the widest MLP. */
mha_status mha_layer_stack_width(const mha_layer_stack *s, int64_t E, int64_t *F);
/* The final norm's weight and bias, when s has one, against width E. */
mha_status mha_layer_stack_check_norm(const mha_layer_stack *s, int64_t E);

/* A (B,L,E) or (L,E) sequence, contiguous; B = 1 for (L,E). */
mha_status mha_layer_seq_check(const mha_tensor *t, const char *name, int64_t *B, int64_t *L,
                               int64_t *E);
/* x: such a sequence (named tgt with memory, else src); memory: NULL (then
 * *S = L) or a sequence of the same rank, batch and width. */
mha_status mha_layer_seq_dims(const mha_tensor *x, const mha_tensor *memory, int64_t *B,
                              int64_t *L, int64_t *S, int64_t *E);
/* Block k's dropout stream for its output (see above). */
int mha_layer_residual_stream(const mha_layer_parts *p, int k);
/* Dropout stream k of layer `layer`. */
uint64_t mha_layer_stream(int64_t layer, int k);
/* True when opt drops out (training with dropout_p > 0). */
bool mha_layer_dropping(const mha_layer_options *opt);
/* o (n) = base + drop(t): a sublayer's residual; t is dropped in place on
 * stream `stream` when mha_layer_dropping(opt).  o may be base. */
void mha_layer_residual(float *o, const float *base, float *t, int64_t n,
                        const mha_layer_options *opt, uint64_t stream);
/* The multi-head options of block b of layer `layer`: the layer's masks
 * (self or cross), its options and an attention-dropout seed per layer and
 * module. */
mha_status mha_layer_attn_options(const mha_layer_options *opt, const mha_layer_masks *masks,
                                  const mha_layer_block *b, int64_t layer,
                                  mha_multihead_options *o);
/* n floats rounded up to a 64-byte line. */
static inline int64_t mha_round_line(int64_t n) { return (n + 15) / 16 * 16; }

/* ---- layer training (transformer_train.c): the public forward_train and
 * backward with the layer index of a stack (dropout streams and attention
 * seeds depend on it, as in the stack's forward); the public calls use 0. */
mha_status mha_encoder_layer_forward_train_at(mha_tensor *out, void *saved, size_t saved_bytes,
                                              const mha_tensor *src,
                                              const mha_encoder_layer_weights *w,
                                              const mha_layer_masks *masks,
                                              const mha_layer_options *opt, void *workspace,
                                              size_t workspace_bytes, int64_t layer);
mha_status mha_encoder_layer_backward_at(mha_tensor *dsrc, const mha_encoder_layer_grads *grads,
                                         const mha_tensor *dout, const void *saved,
                                         size_t saved_bytes, const mha_tensor *src,
                                         const mha_encoder_layer_weights *w,
                                         const mha_layer_masks *masks,
                                         const mha_layer_options *opt, void *workspace,
                                         size_t workspace_bytes, int64_t layer);

/* The layer options every layer call checks first (transformer.c): activation,
 * layer_norm_eps > 0 finite, dropout_p in [0,1), a known kernel. */
mha_status mha_layer_check_options(const mha_layer_options *opt);

#endif /* MHA_LAYERS_H */
