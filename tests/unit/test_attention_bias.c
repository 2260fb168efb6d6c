/* test_attention_bias.c - the bias rule's one choice (src/kernels/attention_bias.h):
 * causality HARD (the kernels: a causally masked score is -inf, the masks
 * unread) or ADDED (multi-head attention's padded mask: -inf + the masks).
 * They agree except where a mask entry above the diagonal is +inf or NaN;
 * the padded mask built for bias_k/add_zero_attn is the ADDED rule.
 *
 * Letter legend: B batch, H heads, L query length, S key length, S' = S + 1
 * (one appended key column).
 */
#include "test.h"
#include "kernels/attention_bias.h"
#include "multihead.h"

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* The (L,S) = (3,4) float mask: +inf, NaN, -inf and finite entries on both
 * sides of the diagonal. */
static const float mask_ls[12] = {0.5f, INFINITY, NAN,   -1.0f, INFINITY, -0.0f,
                                  2.0f, -INFINITY, NAN, 1.5f, 0.25f,     INFINITY};

TEST(attention_bias_causal_rule_hard_and_added) {
    float md[12];
    memcpy(md, mask_ls, sizeof md);
    mha_attn_problem p;
    memset(&p, 0, sizeof p);
    p.B = 1, p.Hq = 1, p.Hkv = 1, p.L = 3, p.S = 4;
    mha_tensor_init(&p.mask, MHA_F32, md, 4, (int64_t[]){1, 1, 3, 4});
    p.mask_polarity = MHA_TRUE_MASKS;
    for (int causal = 0; causal < 2; causal++) {
        p.causal = causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 4; j++) {
                float m = md[i * 4 + j];
                float hard = mha_attn_bias_with(&p, 0, 0, i, j, MHA_CAUSAL_HARD);
                float added = mha_attn_bias_with(&p, 0, 0, i, j, MHA_CAUSAL_ADDED);
                CHECK(bits_of(hard) == bits_of(mha_attn_bias(&p, 0, 0, i, j)));
                if (causal && j > i) {
                    CHECK(hard == -INFINITY);
                    if (isnan(m) || m == INFINITY)
                        CHECK(isnan(added));
                    else
                        CHECK(added == -INFINITY);
                } else {
                    CHECK(bits_of(added) == bits_of(hard));
                    CHECK(isnan(m) ? isnan(hard) : hard == 0.0f + m);
                }
            }
    }
}

TEST(attention_bias_padded_multihead_mask_is_the_added_rule) {
    /* (B,H,L,S') = (2,2,3,5): the (L,S) float mask broadcast over B and H,
     * a (B,S) bool key padding mask, causal; column S is appended (0). */
    float md[12];
    memcpy(md, mask_ls, sizeof md);
    uint8_t kd[8] = {0, 0, 1, 0, 1, 0, 0, 0};
    mh_dims m;
    memset(&m, 0, sizeof m);
    m.batched = true, m.B = 2, m.H = 2, m.L = 3, m.S = 4, m.Sx = 5, m.E = 4;
    mha_tensor attn, kpm, out;
    mha_tensor_init(&attn, MHA_F32, md, 4, (int64_t[]){2, 2, 3, 4});
    attn.stride[0] = attn.stride[1] = 0, attn.stride[2] = 4, attn.stride[3] = 1;
    mha_tensor_init(&kpm, MHA_BOOL, kd, 4, (int64_t[]){2, 2, 3, 4});
    kpm.stride[0] = 4, kpm.stride[1] = kpm.stride[2] = 0, kpm.stride[3] = 1;
    CHECK_STATUS(mha_mh_build_padded_mask(&m, &attn, &kpm, 1, &out), MHA_OK);
    REQUIRE(out.data != NULL && out.shape[0] == 2 && out.shape[1] == 1 && out.shape[3] == 5);
    const float *o = out.data;
    int nan_rows = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 5; j++) {
                float got = o[(b * 3 + i) * 5 + j], want = 0.0f;
                if (j < 4) { /* causal + mask + key padding, added in that order */
                    want = (j > i ? -INFINITY : 0.0f) + md[i * 4 + j];
                    want += kd[b * 4 + j] ? -INFINITY : 0.0f;
                }
                CHECK(bits_of(got) == bits_of(want) || (isnan(got) && isnan(want)));
                nan_rows += isnan(want) && j > i;
            }
    CHECK(nan_rows > 0); /* the case where ADDED and HARD differ is exercised */
    mha_tensor_free(&out);
}
