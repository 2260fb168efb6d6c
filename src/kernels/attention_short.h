/* attention_short.h - self-attention of one short text without masks, the
 * trained encoder's case (src/bert.c): every query sees every key.
 *
 * Letters: L tokens of the text, H heads, d head width (D = H d).
 *   ctx[i, h d + c] = sum_j p[h][i][j] v[j, h d + c],
 *   p[h][i][:] = softmax_j(scale * sum_c q[i, h d + c] k[j, h d + c])
 * q, k, v, ctx are (L, H d) row-major with rows ld apart (ldo for ctx):
 * q, k and v can be column blocks of one (L, 3D) buffer.
 *
 * Why not mha_sdpa_forward: at L ~ 40 and d = 32 its tiles (96 x 128),
 * per-call planning and packing cost more than the products; this kernel
 * keeps one text's K^T for one head (d x L floats) and goes row by row.
 * The reference (_ref) is the plain loop; tests/unit/test_attention_short.c
 * checks it against mha_sdpa_forward and the avx2 and avx512 kernels
 * against it.
 * Neither allocates: ws holds mha_attn_short_ws_floats(L, d) floats.
 */
#ifndef MHA_KERNELS_ATTENTION_SHORT_H
#define MHA_KERNELS_ATTENTION_SHORT_H

#include "../internal.h"

/* Workspace floats for a text of L tokens and head width d. */
int64_t mha_attn_short_ws_floats(int64_t L, int64_t d);

/* True when the avx2 kernel takes head width d (a multiple of 8, <= 64). */
bool mha_attn_short_avx2_fits(int64_t d);

void mha_attn_short_f32_ref(float *ctx, int64_t ldo, const float *q, const float *k,
                            const float *v, int64_t ld, int64_t L, int64_t H, int64_t d,
                            float scale, float *ws);
/* Only after a CPU check and mha_attn_short_avx2_fits(d). */
void mha_attn_short_f32_avx2(float *ctx, int64_t ldo, const float *q, const float *k,
                             const float *v, int64_t ld, int64_t L, int64_t H, int64_t d,
                             float scale, float *ws);

/* The kernel's signature, for the avx512 loop's exported pointer. */
typedef void (*mha_attn_short_fn)(float *ctx, int64_t ldo, const float *q, const float *k,
                                  const float *v, int64_t ld, int64_t L, int64_t H, int64_t d,
                                  float scale, float *ws);
/* The AVX-512 loop (attention_short_avx512.c; any d >= 1): taken only by
 * mha_attn_short_f32_avx512 with MHA_AVX512_PICK. */
MHA_AVX512_DECLARE(mha_attn_short_fn, mha_attn_short_avx512_loop);
/* The same problem on the avx512 loop; MHA_ERR_UNSUPPORTED (naming AVX-512,
 * ctx untouched) unless mha_avx512_runs(). */
mha_status mha_attn_short_f32_avx512(float *ctx, int64_t ldo, const float *q, const float *k,
                                     const float *v, int64_t ld, int64_t L, int64_t H,
                                     int64_t d, float scale, float *ws);

#endif /* MHA_KERNELS_ATTENTION_SHORT_H */
