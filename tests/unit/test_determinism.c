/* test_determinism.c - results are bit-identical (memcmp) for any thread
 * count and over repeated runs, and concurrent calls from several pthreads
 * on shared weights give exactly the serial results.
 *
 * Covers mha_sdpa_forward on every kernel (masks, causal, GQA, dropout,
 * weights output), mha_multihead_forward and the encoder layer.
 */
#include "test.h"

#include <pthread.h>

#define MAX_THREADS 8
#define REPEATS 5

static const mha_kernel kernels[] = {MHA_KERNEL_REF, MHA_KERNEL_SCALAR, MHA_KERNEL_AVX2,
                                     MHA_KERNEL_AVX512};

/* ---- SDPA ----------------------------------------------------------------------- */

/* B=3 Hq=4 Hkv=2 L=37 S=53 d=16 dv=24: odd sizes, so tiles have tails. */
enum { B = 3, HQ = 4, HKV = 2, L = 37, S = 53, D = 16, DV = 24 };

typedef struct sdpa_data {
    float q[B * HQ * L * D], k[B * HKV * S * D], v[B * HKV * S * DV];
    float mask[L * S];
    uint8_t kpm[B * S];
} sdpa_data;

static sdpa_data sd;

static void sdpa_data_init(void) {
    static int done;
    if (done)
        return;
    done = 1;
    test_randn(sd.q, sizeof sd.q / sizeof(float), 51);
    test_randn(sd.k, sizeof sd.k / sizeof(float), 52);
    test_randn(sd.v, sizeof sd.v / sizeof(float), 53);
    test_randn(sd.mask, L * S, 54);
    for (int i = 0; i < B * S; i++)
        sd.kpm[i] = (i * 7) % 11 == 0;
}

/* variant: 0 plain, 1 masks + causal + weights, 2 dropout (training) + weights */
static mha_status sdpa_once(mha_kernel kernel, int variant, float *out, float *weights) {
    mha_tensor q, k, v, o, m, kp, w;
    mha_tensor_init(&q, MHA_F32, sd.q, 4, (int64_t[]){B, HQ, L, D});
    mha_tensor_init(&k, MHA_F32, sd.k, 4, (int64_t[]){B, HKV, S, D});
    mha_tensor_init(&v, MHA_F32, sd.v, 4, (int64_t[]){B, HKV, S, DV});
    mha_tensor_init(&o, MHA_F32, out, 4, (int64_t[]){B, HQ, L, DV});
    mha_tensor_init(&m, MHA_F32, sd.mask, 2, (int64_t[]){L, S});
    mha_tensor_init(&kp, MHA_BOOL, sd.kpm, 2, (int64_t[]){B, S});
    mha_tensor_init(&w, MHA_F32, weights, 4, (int64_t[]){B, HQ, L, S});
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    if (variant == 1) {
        opt.attn_mask = &m, opt.key_padding_mask = &kp, opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
        opt.attn_weights = &w;
    } else if (variant == 2) {
        opt.training = 1, opt.dropout_p = 0.3f, opt.seed = 1234, opt.attn_weights = &w;
    }
    return mha_sdpa_forward(&o, &q, &k, &v, &opt);
}

#define NO (B * HQ * L * DV)
#define NW (B * HQ * L * S)

TEST(determinism_sdpa_threads_1_to_8_and_repeats) {
    sdpa_data_init();
    float *ref_o = malloc(NO * sizeof(float)), *ref_w = calloc(NW, sizeof(float));
    float *o = malloc(NO * sizeof(float)), *w = calloc(NW, sizeof(float));
    for (size_t kk = 0; kk < sizeof kernels / sizeof *kernels; kk++)
        for (int variant = 0; variant < 3; variant++) {
            if (!test_kernel_runs(kernels[kk]))
                break;
            mha_set_num_threads(1);
            mha_status st = sdpa_once(kernels[kk], variant, ref_o, ref_w);
            CHECK_STATUS(st, MHA_OK);
            if (st != MHA_OK)
                continue;
            for (int t = 1; t <= MAX_THREADS; t++) {
                mha_set_num_threads(t);
                for (int r = 0; r < (t == MAX_THREADS ? REPEATS : 1); r++) {
                    memset(o, 0xFF, NO * sizeof(float));
                    memset(w, 0xFF, NW * sizeof(float));
                    CHECK_STATUS(sdpa_once(kernels[kk], variant, o, w), MHA_OK);
                    if (memcmp(o, ref_o, NO * sizeof(float)) ||
                        (variant && memcmp(w, ref_w, NW * sizeof(float))))
                        test_fail(__FILE__, __LINE__,
                                  "sdpa kernel %s variant %d: %d threads (run %d) differs from 1",
                                  mha_kernel_name(kernels[kk]), variant, t, r);
                }
            }
        }
    mha_set_num_threads(0);
    free(ref_o), free(ref_w), free(o), free(w);
}

/* ---- chunks of (b, kv head) pairs ------------------------------------------------ */

/* B=8 Hq=8 Hkv=4 L=150 S=260 d=dv=32: the fused kernels' packed K/V
 * (forward, 1 MiB a chunk) and query tiles (backward) do not fit one chunk,
 * and how many pairs a chunk takes grows with the threads (16 work items at
 * least, 2 per thread): 1, 3 and 12 threads cut the pairs differently, and
 * the results must not move a bit; against the reference within 1e-5
 * (forward) and 1e-4 (backward). */
enum { CB = 8, CHQ = 8, CHKV = 4, CL = 150, CS = 260, CD = 32 };
enum { CNQ = CB * CHQ * CL * CD, CNK = CB * CHKV * CS * CD };

#define TRY(call)                                                                    \
    do {                                                                             \
        const mha_status st_ = (call);                                               \
        if (st_ != MHA_OK)                                                           \
            return st_;                                                              \
    } while (0)

static mha_status chunk_run(mha_kernel kernel, const float *x, float *o, float *g) {
    const int64_t sq[4] = {CB, CHQ, CL, CD}, sk[4] = {CB, CHKV, CS, CD};
    mha_tensor q, k, v, out, dq, dk, dv, dout;
    TRY(mha_tensor_init(&q, MHA_F32, (void *)x, 4, sq));
    TRY(mha_tensor_init(&k, MHA_F32, (void *)(x + CNQ), 4, sk));
    TRY(mha_tensor_init(&v, MHA_F32, (void *)(x + CNQ + CNK), 4, sk));
    TRY(mha_tensor_init(&dout, MHA_F32, (void *)(x + CNQ + 2 * CNK), 4, sq));
    TRY(mha_tensor_init(&out, MHA_F32, o, 4, sq));
    TRY(mha_tensor_init(&dq, MHA_F32, g, 4, sq));
    TRY(mha_tensor_init(&dk, MHA_F32, g + CNQ, 4, sk));
    TRY(mha_tensor_init(&dv, MHA_F32, g + CNQ + CNK, 4, sk));
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    opt.kernel = kernel;
    opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    TRY(mha_sdpa_forward(&out, &q, &k, &v, &opt));
    memset(g, 0, sizeof(float) * (CNQ + 2 * CNK)); /* the backward adds */
    return mha_sdpa_backward(&dq, &dk, &dv, &dout, &out, NULL, &q, &k, &v, &opt);
}

TEST(determinism_sdpa_chunks_of_pairs) {
    const size_t nx = CNQ + 2 * CNK + CNQ, ng = CNQ + 2 * CNK;
    float *x = malloc(sizeof(float) * nx), *ro = malloc(sizeof(float) * CNQ);
    float *rg = malloc(sizeof(float) * ng), *o1 = malloc(sizeof(float) * CNQ);
    float *g1 = malloc(sizeof(float) * ng), *o = malloc(sizeof(float) * CNQ);
    float *g = malloc(sizeof(float) * ng);
    test_randn(x, nx, 61);
    CHECK_STATUS(chunk_run(MHA_KERNEL_REF, x, ro, rg), MHA_OK);
    const int threads[3] = {1, 3, 12};
    for (size_t kk = 1; kk < sizeof kernels / sizeof *kernels; kk++) {
        if (!test_kernel_runs(kernels[kk]))
            continue;
        for (int t = 0; t < 3; t++) {
            mha_set_num_threads(threads[t]);
            CHECK_STATUS(chunk_run(kernels[kk], x, t ? o : o1, t ? g : g1), MHA_OK);
        }
        /* the last run (12 threads) against the first (1 thread) and the reference */
        CHECK(memcmp(o, o1, sizeof(float) * CNQ) == 0);
        CHECK(memcmp(g, g1, sizeof(float) * ng) == 0);
        const double eo = test_rel_err(o1, ro, CNQ), eg = test_rel_err(g1, rg, ng);
        if (!(eo <= 1e-5 && eg <= 1e-4))
            test_fail(__FILE__, __LINE__, "kernel %s: out %.3g (1e-5), grads %.3g (1e-4)",
                      mha_kernel_name(kernels[kk]), eo, eg);
    }
    mha_set_num_threads(0);
    free(x), free(ro), free(rg), free(o1), free(g1), free(o), free(g);
}

/* ---- multi-head attention --------------------------------------------------------- */

enum { MB = 2, ML = 29, MS = 31, ME = 24, MH = 3 };

typedef struct mh_data {
    float x[MB * ML * ME], kv[MB * MS * ME], w_in[3 * ME * ME], b_in[3 * ME], w_out[ME * ME],
        b_out[ME], bk[ME], bv[ME];
    uint8_t kpm[MB * MS];
    mha_tensor X, KV, W_in, B_in, W_out, B_out, Bk, Bv, Kpm;
    mha_multihead_weights w;
} mh_data;

static mh_data md;

static void mh_data_init(void) {
    static int done;
    if (done)
        return;
    done = 1;
    test_randn(md.x, MB * ML * ME, 61), test_randn(md.kv, MB * MS * ME, 62);
    test_randn(md.w_in, 3 * ME * ME, 63), test_randn(md.b_in, 3 * ME, 64);
    test_randn(md.w_out, ME * ME, 65), test_randn(md.b_out, ME, 66);
    test_randn(md.bk, ME, 67), test_randn(md.bv, ME, 68);
    for (int i = 0; i < MB * MS; i++)
        md.kpm[i] = i % 5 == 4;
    mha_tensor_init(&md.X, MHA_F32, md.x, 3, (int64_t[]){MB, ML, ME});
    mha_tensor_init(&md.KV, MHA_F32, md.kv, 3, (int64_t[]){MB, MS, ME});
    mha_tensor_init(&md.W_in, MHA_F32, md.w_in, 2, (int64_t[]){3 * ME, ME});
    mha_tensor_init(&md.B_in, MHA_F32, md.b_in, 1, (int64_t[]){3 * ME});
    mha_tensor_init(&md.W_out, MHA_F32, md.w_out, 2, (int64_t[]){ME, ME});
    mha_tensor_init(&md.B_out, MHA_F32, md.b_out, 1, (int64_t[]){ME});
    mha_tensor_init(&md.Bk, MHA_F32, md.bk, 1, (int64_t[]){ME});
    mha_tensor_init(&md.Bv, MHA_F32, md.bv, 1, (int64_t[]){ME});
    mha_tensor_init(&md.Kpm, MHA_BOOL, md.kpm, 2, (int64_t[]){MB, MS});
    md.w.in_proj_weight = &md.W_in, md.w.in_proj_bias = &md.B_in;
    md.w.out_proj_weight = &md.W_out, md.w.out_proj_bias = &md.B_out;
}

#define MNO (MB * ML * ME)       /* buffer sizes; a call writes (MB,ML-1,.) */
#define MNW (MB * ML * (MS + 2))
#define MNO_USED (MB * (ML - 1) * ME)
#define MNW_USED (MB * (ML - 1) * (MS + 2))

/* variant 0: self-attention, causal; 1: cross-attention with key padding,
 * bias_kv, zero attention, averaged weights, dropout.  x_shift selects a
 * different query (the pthread test gives each thread its own input). */
static mha_status mh_once(int variant, mha_kernel kernel, float *out, float *weights, int x_shift) {
    mha_tensor X = md.X, O, Wt;
    X.data = md.x + x_shift; /* a shifted window of the same buffer: other values */
    X.shape[1] = ML - 1;
    mha_tensor_init(&O, MHA_F32, out, 3, (int64_t[]){MB, ML - 1, ME});
    mha_multihead_weights w = md.w;
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    opt.num_heads = MH;
    opt.kernel = kernel;
    if (variant == 0) {
        opt.causal = MHA_CAUSAL_TOP_LEFT;
        return mha_multihead_forward(&O, &X, &X, &X, &w, &opt);
    }
    w.bias_k = &md.Bk, w.bias_v = &md.Bv;
    opt.add_zero_attn = 1;
    opt.key_padding_mask = &md.Kpm;
    opt.training = 1, opt.dropout_p = 0.2f, opt.seed = 99;
    mha_tensor_init(&Wt, MHA_F32, weights, 3, (int64_t[]){MB, ML - 1, MS + 2});
    opt.attn_weights = &Wt;
    return mha_multihead_forward(&O, &X, &md.KV, &md.KV, &w, &opt);
}

TEST(determinism_multihead_threads_1_to_8_and_repeats) {
    mh_data_init();
    static float ref_o[MNO], ref_w[MNW], o[MNO], w[MNW];
    for (size_t kk = 0; kk < sizeof kernels / sizeof *kernels; kk++)
        for (int variant = 0; variant < 2; variant++) {
            if (!test_kernel_runs(kernels[kk]))
                break;
            mha_set_num_threads(1);
            mha_status st = mh_once(variant, kernels[kk], ref_o, ref_w, 0);
            CHECK_STATUS(st, MHA_OK);
            if (st != MHA_OK)
                continue;
            for (int t = 2; t <= MAX_THREADS; t++) {
                mha_set_num_threads(t);
                for (int r = 0; r < (t == MAX_THREADS ? REPEATS : 1); r++) {
                    memset(o, 0xFF, sizeof o), memset(w, 0xFF, sizeof w);
                    CHECK_STATUS(mh_once(variant, kernels[kk], o, w, 0), MHA_OK);
                    if (memcmp(o, ref_o, MNO_USED * sizeof(float)) ||
                        (variant && memcmp(w, ref_w, MNW_USED * sizeof(float))))
                        test_fail(__FILE__, __LINE__,
                                  "multihead kernel %s variant %d: %d threads differs from 1",
                                  mha_kernel_name(kernels[kk]), variant, t);
                }
            }
        }
    mha_set_num_threads(0);
}

/* ---- encoder layer ------------------------------------------------------------- */

TEST(determinism_encoder_layer_threads) {
    mh_data_init();
    enum { F = 40 };
    static float w1[F * ME], w2[ME * F], b1[F], src[MNO], ref[MNO], out[MNO];
    test_randn(w1, F * ME, 71), test_randn(w2, ME * F, 72), test_randn(b1, F, 73);
    memcpy(src, md.x, sizeof src);
    mha_tensor W1, W2, B1, Src, Out;
    mha_tensor_init(&W1, MHA_F32, w1, 2, (int64_t[]){F, ME});
    mha_tensor_init(&W2, MHA_F32, w2, 2, (int64_t[]){ME, F});
    mha_tensor_init(&B1, MHA_F32, b1, 1, (int64_t[]){F});
    mha_tensor_init(&Src, MHA_F32, src, 3, (int64_t[]){MB, ML, ME});
    mha_encoder_layer_weights lw;
    memset(&lw, 0, sizeof lw);
    lw.self_attn = md.w;
    lw.linear1_weight = &W1, lw.linear1_bias = &B1, lw.linear2_weight = &W2;
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = MH;
    opt.activation = MHA_ACT_GELU;
    opt.training = 1, opt.dropout_p = 0.1f, opt.seed = 5;
    mha_set_num_threads(1);
    mha_tensor_init(&Out, MHA_F32, ref, 3, (int64_t[]){MB, ML, ME});
    REQUIRE_OK(mha_encoder_layer_forward(&Out, &Src, &lw, NULL, &opt, NULL, 0));
    mha_tensor_init(&Out, MHA_F32, out, 3, (int64_t[]){MB, ML, ME});
    for (int t = 2; t <= MAX_THREADS; t++) {
        mha_set_num_threads(t);
        memset(out, 0xFF, sizeof out);
        CHECK_STATUS(mha_encoder_layer_forward(&Out, &Src, &lw, NULL, &opt, NULL, 0), MHA_OK);
        if (memcmp(out, ref, sizeof out))
            test_fail(__FILE__, __LINE__, "encoder layer: %d threads differs from 1", t);
    }
    mha_set_num_threads(0);
}

/* ---- concurrent calls ------------------------------------------------------------- */

#define N_WORKERS 6
#define ROUNDS 8

typedef struct worker {
    pthread_t tid;
    int id;
    mha_kernel kernel;
    float o[MNO], w[MNW], serial_o[MNO], serial_w[MNW];
    float so[NO], sw[NW], serial_so[NO], serial_sw[NW];
    int mismatches;
    mha_status status;
} worker;

static void *worker_main(void *arg) {
    worker *wk = arg;
    for (int r = 0; r < ROUNDS; r++) {
        int variant = (wk->id + r) % 2;
        mha_status st = mh_once(variant, wk->kernel, wk->o, wk->w, wk->id);
        if (st != MHA_OK) {
            wk->status = st;
            break;
        }
        if (variant == 1 && (memcmp(wk->o, wk->serial_o, MNO_USED * sizeof(float)) ||
                             memcmp(wk->w, wk->serial_w, MNW_USED * sizeof(float))))
            wk->mismatches++;
        st = sdpa_once(wk->kernel, 1, wk->so, wk->sw);
        if (st != MHA_OK) {
            wk->status = st;
            break;
        }
        if (memcmp(wk->so, wk->serial_so, sizeof wk->so) ||
            memcmp(wk->sw, wk->serial_sw, sizeof wk->sw))
            wk->mismatches++;
    }
    return NULL;
}

TEST(determinism_concurrent_calls_on_shared_weights) {
    mh_data_init();
    sdpa_data_init();
    for (size_t kk = 0; kk < sizeof kernels / sizeof *kernels; kk++) {
        worker *wk = calloc(N_WORKERS, sizeof *wk);
        REQUIRE(wk != NULL);
        mha_set_num_threads(1);
        bool available = test_kernel_runs(kernels[kk]);
        for (int i = 0; i < N_WORKERS && available; i++) {
            wk[i].id = i, wk[i].kernel = kernels[kk];
            available = mh_once(1, kernels[kk], wk[i].serial_o, wk[i].serial_w, i) == MHA_OK &&
                        sdpa_once(kernels[kk], 1, wk[i].serial_so, wk[i].serial_sw) == MHA_OK;
            CHECK(available);
        }
        mha_set_num_threads(2); /* each call also runs its own OpenMP team */
        for (int i = 0; i < N_WORKERS && available; i++)
            REQUIRE(pthread_create(&wk[i].tid, NULL, worker_main, &wk[i]) == 0);
        for (int i = 0; i < N_WORKERS && available; i++) {
            pthread_join(wk[i].tid, NULL);
            if (wk[i].status != MHA_OK || wk[i].mismatches)
                test_fail(__FILE__, __LINE__,
                          "kernel %s worker %d: status %s, %d results differ from serial",
                          mha_kernel_name(kernels[kk]), i, mha_status_string(wk[i].status),
                          wk[i].mismatches);
        }
        mha_set_num_threads(0);
        free(wk);
    }
}
