/* rope.c - rotary position embeddings.
 *
 * Letter legend: B batch, H heads, L positions, d head dim (even).
 *
 * ref: Su et al., "RoFormer: Enhanced Transformer with Rotary Position
 * Embedding" (2021), eq. 34: pair c rotates by t * theta_c,
 * theta_c = base^(-2c/d).  HALF_SPLIT pairs (c, c + d/2) (GPT-NeoX, the
 * LLaMA weights as Hugging Face stores them, ONNX RotaryEmbedding
 * interleaved=0); INTERLEAVED pairs (2c, 2c + 1) (GPT-J, the paper,
 * ONNX interleaved=1).
 */
#include "internal.h"

mha_status mha_rope_apply(mha_tensor *x, int64_t pos_offset, const mha_tensor *pos_offsets,
                          float base, mha_rope_mode mode) {
    char sb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(x, "x", 4, MHA_F32));
    MHA_TRY(mha_check_writable(x, "x"));
    const int64_t B = x->shape[0], H = x->shape[1], L = x->shape[2], d = x->shape[3];
    MHA_CHECK(mode == MHA_ROPE_HALF_SPLIT || mode == MHA_ROPE_INTERLEAVED, MHA_ERR_VALUE,
              "mode: %d, want MHA_ROPE_HALF_SPLIT or MHA_ROPE_INTERLEAVED", (int)mode);
    MHA_CHECK(d % 2 == 0, MHA_ERR_SHAPE, "x: shape %s, head dim d must be even",
              mha_shape_str(x, sb, sizeof sb));
    MHA_CHECK(isfinite(base) && base >= 0.0f, MHA_ERR_VALUE, "base: %g, want > 0 (0 = 10000)",
              (double)base);
    const double theta0 = base > 0.0f ? (double)base : 10000.0;
    if (pos_offsets) {
        MHA_TRY(mha_check_tensor(pos_offsets, "pos_offsets", 1, MHA_I64));
        MHA_CHECK(pos_offsets->shape[0] == B, MHA_ERR_SHAPE, "pos_offsets: shape %s, want (%lld)",
                  mha_shape_str(pos_offsets, sb, sizeof sb), (long long)B);
    }
    const int64_t half = d / 2;
    float *data = x->data;
    for (int64_t b = 0; b < B; b++) {
        int64_t off = pos_offset;
        if (pos_offsets)
            off += ((const int64_t *)pos_offsets->data)[b * pos_offsets->stride[0]];
        for (int64_t i = 0; i < L; i++) {
            const double t = (double)(off + i);
            for (int64_t c = 0; c < half; c++) {
                const double ang = t * pow(theta0, -2.0 * (double)c / (double)d);
                const double cs = cos(ang), sn = sin(ang);
                const int64_t ca = mode == MHA_ROPE_HALF_SPLIT ? c : 2 * c;
                const int64_t cb = mode == MHA_ROPE_HALF_SPLIT ? c + half : 2 * c + 1;
                for (int64_t h = 0; h < H; h++) {
                    float *row = data + b * x->stride[0] + h * x->stride[1] + i * x->stride[2];
                    const double xa = row[ca * x->stride[3]], xb = row[cb * x->stride[3]];
                    row[ca * x->stride[3]] = (float)(xa * cs - xb * sn);
                    row[cb * x->stride[3]] = (float)(xa * sn + xb * cs);
                }
            }
        }
    }
    return MHA_OK;
}
