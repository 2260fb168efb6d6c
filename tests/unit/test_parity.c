/* test_parity.c - nn.MultiheadAttention and SDPA against PyTorch fixtures.
 *
 * Rule (issue 2): per tensor max|y - ref| <= 1e-5 * max(1, max|ref|), NaN
 * only where the reference has NaN.  Every kernel is checked (MHA_KERNEL
 * selects which one runs; the fast kernels are also compared with the
 * reference directly in test_flash.c).
 */
#include "fixture.h"

#define PARITY_TOL 1e-5
#define MAX_CASES 512

static double worst_mha, worst_sdpa;

static void run_mha_case(const char *name) {
    fixture f;
    if (!fixture_open(&f, "mha", name)) {
        test_fail(__FILE__, __LINE__, "%s: no config.txt", name);
        return;
    }
    enum { Q, K, V, INW, QW, KW, VW, INB, OUTW, OUTB, BK, BV, KPM, AM, OUT, WREF, N_T };
    mha_tensor t[N_T];
    memset(t, 0, sizeof t);
    const char *files[N_T] = {"query.npy",        "key.npy",          "value.npy",
                              "in_proj_weight.npy", "q_proj_weight.npy", "k_proj_weight.npy",
                              "v_proj_weight.npy", "in_proj_bias.npy", "out_proj_weight.npy",
                              "out_proj_bias.npy", "bias_k.npy",       "bias_v.npy",
                              "key_padding_mask.npy", "attn_mask.npy", "out.npy",
                              "attn_weights.npy"};
    const mha_tensor *p[N_T];
    for (int i = 0; i < N_T; i++)
        p[i] = fixture_optional(&f, files[i], (i == KPM || i == AM) ? -1 : MHA_F32, &t[i]);
    if (!p[Q] || !p[OUT] || !p[OUTW]) {
        test_fail(__FILE__, __LINE__, "%s: missing query/out/out_proj_weight", name);
        goto done;
    }
    bool self = fixture_int(&f, "self_attn") != 0;
    mha_multihead_weights w = {p[INW], p[QW], p[KW], p[VW], p[INB], p[OUTW], p[OUTB], p[BK], p[BV]};
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = fixture_int(&f, "heads");
    opt.add_zero_attn = (int)fixture_int(&f, "add_zero_attn");
    opt.key_padding_mask = p[KPM];
    opt.attn_mask = p[AM];
    opt.causal = (int)fixture_int(&f, "causal");
    opt.average_attn_weights = (int)fixture_int(&f, "average_weights");
    opt.masked_rows = !strcmp(fixture_str(&f, "masked_rows"), "nan") ? MHA_MASKED_ROWS_NAN
                                                                       : MHA_MASKED_ROWS_ZERO;
    mha_tensor out, weights;
    if (mha_tensor_create(&out, MHA_F32, t[OUT].ndim, t[OUT].shape) != MHA_OK)
        goto done;
    bool need_weights = fixture_int(&f, "need_weights") != 0 && p[WREF];
    if (need_weights && mha_tensor_create(&weights, MHA_F32, t[WREF].ndim, t[WREF].shape) != MHA_OK) {
        mha_tensor_free(&out);
        goto done;
    }
    opt.attn_weights = need_weights ? &weights : NULL;
    const mha_tensor *key = self ? p[Q] : p[K], *value = self ? p[Q] : p[V];
    mha_status st = mha_multihead_forward(&out, p[Q], key, value, &w, &opt);
    if (st != MHA_OK) {
        test_fail(__FILE__, __LINE__, "%s: %s (%s)", name, mha_status_string(st), mha_last_error());
    } else {
        fixture_compare(name, "out", out.data, &t[OUT], PARITY_TOL, &worst_mha);
        if (need_weights)
            fixture_compare(name, "weights", weights.data, &t[WREF], PARITY_TOL, &worst_mha);
    }
    mha_tensor_free(&out);
    if (need_weights)
        mha_tensor_free(&weights);
done:
    for (int i = 0; i < N_T; i++)
        mha_tensor_free(&t[i]);
}

TEST(parity_multihead_pytorch) {
    static char names[MAX_CASES][128];
    int n = fixture_list("mha", names, MAX_CASES);
    CHECK(n >= 100); /* issue 2: at least 100 configurations */
    worst_mha = 0.0;
    for (int i = 0; i < n; i++)
        run_mha_case(names[i]);
    printf("parity: nn.MultiheadAttention %d cases (kernel %s), worst error %.3g\n", n,
           mha_kernel_name(mha_kernel_resolve(MHA_KERNEL_AUTO)), worst_mha);
}

static void run_sdpa_case(const char *name) {
    fixture f;
    if (!fixture_open(&f, "sdpa", name)) {
        test_fail(__FILE__, __LINE__, "%s: no config.txt", name);
        return;
    }
    mha_tensor q = {0}, k = {0}, v = {0}, mask = {0}, kpm = {0}, ref = {0}, wref = {0};
    mha_tensor out = {0}, weights = {0};
    if (fixture_load(&f, "q.npy", MHA_F32, &q) || fixture_load(&f, "k.npy", MHA_F32, &k) ||
        fixture_load(&f, "v.npy", MHA_F32, &v) || fixture_load(&f, "out.npy", MHA_F32, &ref) ||
        fixture_load(&f, "weights.npy", MHA_F32, &wref)) {
        test_fail(__FILE__, __LINE__, "%s: %s", name, mha_last_error());
        goto done;
    }
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.scale_set = (int)fixture_int(&f, "scale_set");
    opt.scale = (float)atof(fixture_str(&f, "scale"));
    opt.causal = fixture_causal(&f, "causal");
    opt.attn_mask = fixture_optional(&f, "mask.npy", -1, &mask);
    opt.key_padding_mask = fixture_optional(&f, "key_padding_mask.npy", MHA_BOOL, &kpm);
    opt.attn_mask_polarity = MHA_TRUE_KEEPS;
    opt.key_padding_polarity = MHA_TRUE_MASKS;
    if (mha_tensor_create(&out, MHA_F32, 4, ref.shape) || mha_tensor_create(&weights, MHA_F32, 4, wref.shape))
        goto done;
    /* once without weights (the fused path), once with */
    CHECK_STATUS(mha_sdpa_forward(&out, &q, &k, &v, &opt), MHA_OK);
    fixture_compare(name, "out", out.data, &ref, PARITY_TOL, &worst_sdpa);
    opt.attn_weights = &weights;
    CHECK_STATUS(mha_sdpa_forward(&out, &q, &k, &v, &opt), MHA_OK);
    fixture_compare(name, "out (with weights)", out.data, &ref, PARITY_TOL, &worst_sdpa);
    fixture_compare(name, "weights", weights.data, &wref, PARITY_TOL, &worst_sdpa);
done:;
    mha_tensor *all[] = {&q, &k, &v, &mask, &kpm, &ref, &wref, &out, &weights};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        mha_tensor_free(all[i]);
}

TEST(parity_sdpa_pytorch) {
    static char names[MAX_CASES][128];
    int n = fixture_list("sdpa", names, MAX_CASES);
    CHECK(n >= 40);
    worst_sdpa = 0.0;
    for (int i = 0; i < n; i++)
        run_sdpa_case(names[i]);
    printf("parity: scaled dot-product attention %d cases (kernel %s), worst error %.3g\n", n,
           mha_kernel_name(mha_kernel_resolve(MHA_KERNEL_AUTO)), worst_sdpa);
}
