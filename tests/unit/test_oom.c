/* test_oom.c - allocation-failure and I/O-failure injection over every
 * public entry point that allocates or reads (SQLite's OOM loop).
 *
 * For k = 1, 2, ... the k-th allocation of the call fails (mha_test_fail_alloc),
 * once and then persistently, until the call runs to completion without
 * meeting the injected failure.  Every failing call must return
 * MHA_ERR_NOMEM with a message, free everything it allocated (the live
 * allocation count returns to its value before the call; LeakSanitizer
 * checks the rest under `make SAN=1 test`) and leave no half-built output
 * (an owned output's data is NULL).  The same loop runs over the file
 * layer's read hook (mha_test_fail_io): read errors, short reads and
 * premature end of file, at the k-th read, once and persistently.
 *
 * The last test prints "oom: N injection points (A allocation, I i/o)".
 */
#include "test.h"

#include "io/io.h"

#include <unistd.h>

static int64_t alloc_points, io_points;

/* One call under test: returns its status; on success it releases what it
 * made, on failure it checks that nothing half-built is left. */
typedef mha_status (*oom_call)(void *ctx);

/* The allocation loop.  Returns the injection points this call has. */
static int64_t oom_loop(const char *name, oom_call call, void *ctx) {
    int64_t points = 0;
    for (int persistent = 0; persistent <= 1; persistent++) {
        for (int64_t k = 1;; k++) {
            int64_t live0 = mha_test_live_allocs(), count0 = mha_test_alloc_count();
            mha_test_fail_alloc(k, persistent);
            mha_status st = call(ctx);
            mha_test_fail_alloc(0, 0);
            int64_t made = mha_test_alloc_count() - count0;
            int64_t leaked = mha_test_live_allocs() - live0;
            if (leaked != 0)
                test_fail(__FILE__, __LINE__, "%s: k=%lld %s: %lld allocation(s) leaked", name,
                          (long long)k, persistent ? "persistent" : "once", (long long)leaked);
            if (made < k) { /* the call never reached the injected failure */
                if (st != MHA_OK)
                    test_fail(__FILE__, __LINE__, "%s: uninjected run -> %s (%s)", name,
                              mha_status_string(st), mha_last_error());
                break;
            }
            points++;
            if (st != MHA_ERR_NOMEM)
                test_fail(__FILE__, __LINE__, "%s: allocation %lld failed (%s) -> %s, want %s",
                          name, (long long)k, persistent ? "persistent" : "once",
                          mha_status_string(st), mha_status_string(MHA_ERR_NOMEM));
            else if (mha_last_error()[0] == '\0')
                test_fail(__FILE__, __LINE__, "%s: k=%lld: NOMEM without a message", name,
                          (long long)k);
            if (k > 100000 || test_failures() > 20) {
                test_fail(__FILE__, __LINE__, "%s: giving up at k=%lld", name, (long long)k);
                break;
            }
        }
    }
    if (points == 0) /* a loop that injects nothing proves nothing: said, not passed */
        SKIP_PART("%s: allocates nothing, no failure to inject", name);
    alloc_points += points;
    return points;
}

/* ---- tensors ------------------------------------------------------------------- */

static mha_status call_tensor_alloc(void *ctx) {
    (void)ctx;
    mha_tensor t;
    memset(&t, 0xAB, sizeof t); /* garbage in: a failed call must not leave it */
    mha_status st = mha_tensor_create(&t, MHA_F32, 3, (int64_t[]){2, 3, 5});
    if (st == MHA_OK) {
        CHECK(((float *)t.data)[29] == 0.0f);
        mha_tensor_free(&t);
        CHECK(t.data == NULL);
    } else {
        CHECK(t.data == NULL);
        mha_tensor_free(&t); /* must be harmless after a failure */
    }
    return st;
}

TEST(oom_tensor_alloc) { CHECK(oom_loop("mha_tensor_create", call_tensor_alloc, NULL) >= 1); }

/* ---- scaled dot-product attention ------------------------------------------- */

typedef struct sdpa_ctx {
    mha_tensor q, k, v, o, mask, kpm, w;
    float *buf[7];
    mha_sdpa_options opt;
} sdpa_ctx;

/* B=2 Hq=4 Hkv=2 L=5 S=7 d=3 dv=6; bool mask (L,S), kpm (B,S), weights. */
static void sdpa_setup(sdpa_ctx *c, mha_kernel kernel, bool masks, bool weights) {
    memset(c, 0, sizeof *c);
    c->buf[0] = test_tensor(&c->q, 4, (int64_t[]){2, 4, 5, 3}, 1);
    c->buf[1] = test_tensor(&c->k, 4, (int64_t[]){2, 2, 7, 3}, 2);
    c->buf[2] = test_tensor(&c->v, 4, (int64_t[]){2, 2, 7, 6}, 3);
    c->buf[3] = test_tensor(&c->o, 4, (int64_t[]){2, 4, 5, 6}, 4);
    c->buf[4] = test_tensor(&c->w, 4, (int64_t[]){2, 4, 5, 7}, 5);
    c->buf[5] = calloc(5 * 7, 1);
    c->buf[6] = calloc(2 * 7, 1);
    uint8_t *m = (uint8_t *)c->buf[5], *kp = (uint8_t *)c->buf[6];
    for (int i = 0; i < 35; i++)
        m[i] = (i % 4) != 1; /* true keeps */
    kp[6] = kp[13] = 1;      /* true masks the last key */
    mha_tensor_init(&c->mask, MHA_BOOL, m, 2, (int64_t[]){5, 7});
    mha_tensor_init(&c->kpm, MHA_BOOL, kp, 2, (int64_t[]){2, 7});
    mha_sdpa_options_init(&c->opt);
    c->opt.kernel = kernel;
    if (masks) {
        c->opt.attn_mask = &c->mask;
        c->opt.key_padding_mask = &c->kpm;
        c->opt.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    }
    if (weights)
        c->opt.attn_weights = &c->w;
}

static void sdpa_teardown(sdpa_ctx *c) {
    for (int i = 0; i < 7; i++)
        free(c->buf[i]);
}

static mha_status call_sdpa(void *ctx) {
    sdpa_ctx *c = ctx;
    return mha_sdpa_forward(&c->o, &c->q, &c->k, &c->v, &c->opt);
}

static const mha_kernel all_kernels[] = {MHA_KERNEL_AUTO, MHA_KERNEL_REF, MHA_KERNEL_SCALAR,
                                         MHA_KERNEL_AVX2, MHA_KERNEL_AVX512};

/* True when this build and CPU run `kernel` (the fused kernels may be absent). */
static bool kernel_available(mha_kernel kernel) {
    sdpa_ctx c;
    sdpa_setup(&c, kernel, false, false);
    mha_status st = call_sdpa(&c);
    sdpa_teardown(&c);
    if (st != MHA_OK)
        SKIP_PART("kernel %s: not in this build or on this CPU", mha_kernel_name(kernel));
    return st == MHA_OK;
}

TEST(oom_sdpa_every_kernel) {
    for (size_t i = 0; i < sizeof all_kernels / sizeof *all_kernels; i++) {
        if (!kernel_available(all_kernels[i]))
            continue;
        for (int variant = 0; variant < 4; variant++) {
            sdpa_ctx c;
            sdpa_setup(&c, all_kernels[i], variant & 1, variant & 2);
            char name[96];
            snprintf(name, sizeof name, "mha_sdpa_forward(kernel %s, masks %d, weights %d)",
                     mha_kernel_name(all_kernels[i]), variant & 1, (variant & 2) != 0);
            oom_loop(name, call_sdpa, &c);
            sdpa_teardown(&c);
        }
    }
}

/* ---- scaled dot-product attention, backward ------------------------------------ */

typedef struct sdpa_bwd_ctx {
    sdpa_ctx f;
    mha_tensor dq, dk, dv, dout;
    float *buf[4];
} sdpa_bwd_ctx;

static mha_status call_sdpa_backward(void *ctx) {
    sdpa_bwd_ctx *c = ctx;
    /* out and lse NULL: the backward recomputes them (its largest scratch) */
    return mha_sdpa_backward(&c->dq, &c->dk, &c->dv, &c->dout, NULL, NULL, &c->f.q, &c->f.k,
                             &c->f.v, &c->f.opt);
}

TEST(oom_sdpa_backward_every_kernel) {
    for (size_t i = 0; i < sizeof all_kernels / sizeof *all_kernels; i++) {
        if (!kernel_available(all_kernels[i]))
            continue;
        for (int masks = 0; masks <= 1; masks++) {
            sdpa_bwd_ctx c;
            sdpa_setup(&c.f, all_kernels[i], masks, false);
            c.buf[0] = test_tensor(&c.dq, 4, (int64_t[]){2, 4, 5, 3}, 11);
            c.buf[1] = test_tensor(&c.dk, 4, (int64_t[]){2, 2, 7, 3}, 12);
            c.buf[2] = test_tensor(&c.dv, 4, (int64_t[]){2, 2, 7, 6}, 13);
            c.buf[3] = test_tensor(&c.dout, 4, (int64_t[]){2, 4, 5, 6}, 14);
            char name[96];
            snprintf(name, sizeof name, "mha_sdpa_backward kernel=%s masks=%d",
                     mha_kernel_name(all_kernels[i]), masks);
            CHECK(oom_loop(name, call_sdpa_backward, &c) >= 1);
            for (int b = 0; b < 4; b++)
                free(c.buf[b]);
            sdpa_teardown(&c.f);
        }
    }
}

/* ---- multi-head attention --------------------------------------------------- */

typedef struct mh_ctx {
    mha_tensor x, kx, vx, o, w_in, wq, wk, wv, b_in, w_out, b_out, bk, bv, am, kpm, wts;
    float *buf[16];
    int nbuf;
    mha_multihead_weights w;
    mha_multihead_options opt;
    bool cross;
} mh_ctx;

static float *mh_tensor(mh_ctx *c, mha_tensor *t, int ndim, const int64_t *shape) {
    float *p = test_tensor(t, ndim, shape, (uint64_t)(100 + c->nbuf));
    c->buf[c->nbuf++] = p;
    return p;
}

/* E=6 H=2 B=2 L=4 S=5 kdim=3 vdim=7.  variant bits: 1 cross-attention with
 * separate weights, 2 masks (bool attn_mask + float kpm + causal),
 * 4 add_bias_kv + add_zero_attn, 8 weights averaged, 16 weights per head,
 * 32 unbatched. */
static void mh_setup(mh_ctx *c, int variant, mha_kernel kernel) {
    memset(c, 0, sizeof *c);
    const int64_t E = 6, B = 2, L = 4, S = 5, kd = 3, vd = 7;
    bool cross = variant & 1, ub = variant & 32;
    c->cross = cross;
    int64_t xs[3] = {B, L, E}, ks[3] = {B, S, cross ? kd : E}, vs[3] = {B, S, cross ? vd : E};
    int o = ub ? 1 : 0, nd = ub ? 2 : 3;
    mh_tensor(c, &c->x, nd, xs + o);
    mh_tensor(c, &c->o, nd, xs + o);
    if (cross) {
        mh_tensor(c, &c->kx, nd, ks + o);
        mh_tensor(c, &c->vx, nd, vs + o);
        mh_tensor(c, &c->wq, 2, (int64_t[]){E, E});
        mh_tensor(c, &c->wk, 2, (int64_t[]){E, kd});
        mh_tensor(c, &c->wv, 2, (int64_t[]){E, vd});
        c->w.q_proj_weight = &c->wq, c->w.k_proj_weight = &c->wk, c->w.v_proj_weight = &c->wv;
    } else {
        mh_tensor(c, &c->w_in, 2, (int64_t[]){3 * E, E});
        c->w.in_proj_weight = &c->w_in;
    }
    mh_tensor(c, &c->b_in, 1, (int64_t[]){3 * E});
    mh_tensor(c, &c->w_out, 2, (int64_t[]){E, E});
    mh_tensor(c, &c->b_out, 1, (int64_t[]){E});
    c->w.in_proj_bias = &c->b_in, c->w.out_proj_weight = &c->w_out, c->w.out_proj_bias = &c->b_out;
    mha_multihead_options_init(&c->opt);
    c->opt.num_heads = 2;
    c->opt.kernel = kernel;
    int64_t Sk = cross ? S : L;
    if (variant & 2) {
        uint8_t *am = calloc((size_t)(L * Sk), 1);
        for (int64_t i = 0; i < L * Sk; i++)
            am[i] = (i % 5) == 3;
        c->buf[c->nbuf++] = (float *)am;
        mha_tensor_init(&c->am, MHA_BOOL, am, 2, (int64_t[]){L, Sk});
        float *kp = mh_tensor(c, &c->kpm, ub ? 1 : 2, (int64_t[]){B, Sk} + o);
        for (int64_t i = 0; i < (ub ? 1 : B) * Sk; i++)
            kp[i] = (i % 3) ? 0.0f : -1.5f;
        c->opt.attn_mask = &c->am;
        c->opt.key_padding_mask = &c->kpm;
        c->opt.causal = MHA_CAUSAL_TOP_LEFT;
    }
    if (variant & 4) {
        mh_tensor(c, &c->bk, 3, (int64_t[]){1, 1, E});
        mh_tensor(c, &c->bv, 1, (int64_t[]){E});
        c->w.bias_k = &c->bk, c->w.bias_v = &c->bv;
        c->opt.add_zero_attn = 1;
    }
    int64_t Sx = Sk + ((variant & 4) ? 2 : 0);
    if (variant & 8) {
        int64_t ws[3] = {B, L, Sx};
        mh_tensor(c, &c->wts, nd, ws + o);
        c->opt.attn_weights = &c->wts;
    } else if (variant & 16) {
        int64_t ws[4] = {B, 2, L, Sx};
        mh_tensor(c, &c->wts, ub ? 3 : 4, ws + o);
        c->opt.attn_weights = &c->wts;
        c->opt.average_attn_weights = 0;
    }
}

static void mh_teardown(mh_ctx *c) {
    for (int i = 0; i < c->nbuf; i++)
        free(c->buf[i]);
}

static mha_status call_mh(void *ctx) {
    mh_ctx *c = ctx;
    const mha_tensor *k = c->cross ? &c->kx : &c->x, *v = c->cross ? &c->vx : &c->x;
    return mha_multihead_forward(&c->o, &c->x, k, v, &c->w, &c->opt);
}

TEST(oom_multihead_masks_bias_kv_weights) {
    static const int variants[] = {0, 1, 2, 3, 4, 6, 7, 8, 16, 2 | 4 | 8, 1 | 2 | 4 | 16, 32,
                                   32 | 2 | 4 | 8, 32 | 1 | 16};
    for (size_t k = 0; k < sizeof all_kernels / sizeof *all_kernels; k++) {
        if (!kernel_available(all_kernels[k]))
            continue;
        for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
            mh_ctx c;
            mh_setup(&c, variants[i], all_kernels[k]);
            char name[96];
            snprintf(name, sizeof name, "mha_multihead_forward(variant %d, kernel %s)",
                     variants[i], mha_kernel_name(all_kernels[k]));
            oom_loop(name, call_mh, &c);
            mh_teardown(&c);
        }
    }
}

/* ---- files -------------------------------------------------------------------- */

static const char *fixture(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/io/%s", test_fixture_root(), name);
    return buf;
}

typedef struct npy_ctx {
    const char *path;
    mha_dtype want;
    int any, as_mask;
} npy_ctx;

static mha_status call_npy_load(void *ctx) {
    npy_ctx *c = ctx;
    mha_tensor t;
    memset(&t, 0xAB, sizeof t);
    mha_dtype fd;
    mha_status st = c->any ? mha_npy_load_any(&t, &fd, c->path, c->as_mask)
                           : mha_npy_load(&t, c->path, c->want);
    if (st == MHA_OK)
        mha_tensor_free(&t);
    else
        CHECK(t.data == NULL || t.data == (void *)(uintptr_t)0xABABABABABABABABull);
    return st;
}

static char tmp_path[256];

static const char *tmp_file(void) {
    if (!tmp_path[0])
        snprintf(tmp_path, sizeof tmp_path, "/tmp/mha-oom-%d.npy", (int)getpid());
    return tmp_path;
}

/* After a failed write to a new path: no half-written file.  Only a failed
 * directory fsync (after the rename) leaves the complete new file. */
static void check_no_partial_file(void) {
    if (!strstr(mha_last_error(), "syncing its directory"))
        CHECK(access(tmp_file(), F_OK) != 0);
}

typedef struct save_ctx {
    const mha_tensor *t;
    mha_dtype as;
} save_ctx;

static mha_status call_npy_save(void *ctx) {
    save_ctx *c = ctx;
    mha_status st = mha_npy_save(c->t, tmp_file(), c->as);
    if (st != MHA_OK)
        check_no_partial_file();
    remove(tmp_file());
    return st;
}

static const npy_ctx npy_cases[] = {
    {"np_f4_3x5.npy", MHA_F32, 0, 0},      {"np_f8_3x5.npy", MHA_F32, 0, 0},
    {"np_f2_7x8.npy", MHA_F32, 0, 0},      {"np_b1_3x5.npy", MHA_BOOL, 0, 0},
    {"np_i8_3x5.npy", MHA_I64, 0, 0},      {"np_f4_2x3x4x5.npy", MHA_F32, 0, 0},
    {"np_u1_3x5.npy", MHA_F32, 1, 1},      {"np_i4_3x5.npy", MHA_F32, 1, 0},
    {"np_f4_0x3.npy", MHA_F32, 0, 0},
};

TEST(oom_npy_load_and_save) {
    for (size_t i = 0; i < sizeof npy_cases / sizeof *npy_cases; i++) {
        npy_ctx c = npy_cases[i];
        c.path = fixture(npy_cases[i].path);
        if (access(c.path, R_OK) != 0)
            continue; /* fixture set changed: covered by test_io_npy */
        char name[128];
        snprintf(name, sizeof name, "mha_npy_load(%s)", npy_cases[i].path);
        oom_loop(name, call_npy_load, &c);
    }
    mha_tensor t;
    float *data = test_tensor(&t, 3, (int64_t[]){2, 3, 4}, 9);
    mha_tensor strided = t; /* a non-contiguous view: every other row */
    strided.shape[1] = 2, strided.stride[1] = 8;
    save_ctx cases[] = {{&t, MHA_F32}, {&t, MHA_F16}, {&strided, MHA_F32}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        oom_loop("mha_npy_save", call_npy_save, &cases[i]);
    free(data);
}

/* ---- I/O faults ---------------------------------------------------------------- */

/* The read loop: fault at the k-th read/map/write, once and persistently,
 * until a call completes without meeting it.  A read error must end in
 * MHA_ERR_IO, a premature end of file in MHA_ERR_FORMAT, unless the fault
 * hit an operation the code may recover from (a map attempt falls back to
 * reads; a short read is retried): then MHA_OK is fine too.  For a writer
 * (writes) every injected fault but a short write is a failed step: MHA_ERR_IO. */
static int64_t io_loop(const char *name, oom_call call, void *ctx, bool writes) {
    static const mha_io_fault faults[] = {MHA_IO_FAULT_FAIL, MHA_IO_FAULT_SHORT, MHA_IO_FAULT_EOF};
    static const char *fault_names[] = {"read error", "short read", "end of file"};
    int64_t points = 0;
    for (int f = 0; f < 3; f++)
        for (int persistent = 0; persistent <= 1; persistent++)
            for (int64_t k = 1;; k++) {
                int64_t live0 = mha_test_live_allocs(), count0 = mha_test_io_count();
                mha_test_fail_io(k, persistent, faults[f]);
                mha_status st = call(ctx);
                mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
                int64_t ops = mha_test_io_count() - count0;
                if (mha_test_live_allocs() != live0)
                    test_fail(__FILE__, __LINE__, "%s: %s at op %lld leaks", name,
                              fault_names[f], (long long)k);
                if (ops < k) {
                    if (st != MHA_OK)
                        test_fail(__FILE__, __LINE__, "%s: uninjected run -> %s (%s)", name,
                                  mha_status_string(st), mha_last_error());
                    break;
                }
                points++;
                bool ok = st == MHA_OK ||
                          (faults[f] == MHA_IO_FAULT_FAIL && st == MHA_ERR_IO) ||
                          (faults[f] == MHA_IO_FAULT_EOF && st == MHA_ERR_FORMAT);
                if (faults[f] == MHA_IO_FAULT_SHORT && !persistent)
                    ok = st == MHA_OK; /* one short read is always retried */
                if (writes) /* a short write(2) is retried; every other fault fails */
                    ok = faults[f] == MHA_IO_FAULT_SHORT ? st == MHA_OK : st == MHA_ERR_IO;
                if (!ok)
                    test_fail(__FILE__, __LINE__, "%s: %s at op %lld (%s) -> %s (%s)", name,
                              fault_names[f], (long long)k, persistent ? "persistent" : "once",
                              mha_status_string(st), mha_last_error());
                if (st != MHA_OK && mha_last_error()[0] == '\0')
                    test_fail(__FILE__, __LINE__, "%s: failure without a message", name);
                if (k > 100000 || test_failures() > 20)
                    break;
            }
    if (points == 0)
        SKIP_PART("%s: no I/O operation, no failure to inject", name);
    io_points += points;
    return points;
}

TEST(io_faults_npy_load_and_save) {
    for (size_t i = 0; i < sizeof npy_cases / sizeof *npy_cases; i++) {
        npy_ctx c = npy_cases[i];
        c.path = fixture(npy_cases[i].path);
        if (access(c.path, R_OK) != 0)
            continue;
        char name[128];
        snprintf(name, sizeof name, "mha_npy_load(%s)", npy_cases[i].path);
        io_loop(name, call_npy_load, &c, false);
    }
    mha_tensor t;
    float *data = test_tensor(&t, 2, (int64_t[]){3, 4}, 10);
    save_ctx c = {&t, MHA_F32};
    io_loop("mha_npy_save", call_npy_save, &c, true);
    free(data);
}

/* ---- safetensors ----------------------------------------------------------------- */

/* Opens a file and takes every tensor out both ways (owned copy and view),
 * reads the metadata; frees all.  A failed open leaves *st NULL. */
static mha_status call_safetensors(void *ctx) {
    const char *path = ctx;
    mha_safetensors *st = (mha_safetensors *)(uintptr_t)1; /* garbage in */
    mha_status s = mha_safetensors_open(&st, path);
    if (s != MHA_OK) {
        CHECK(st == NULL);
        return s;
    }
    for (int64_t i = 0; i < mha_safetensors_count(st) && s == MHA_OK; i++) {
        const char *name = mha_safetensors_name(st, i);
        int ndim = 0;
        s = mha_safetensors_info(st, i, NULL, &ndim, NULL);
        if (s != MHA_OK || ndim > MHA_MAX_DIMS)
            continue;
        mha_tensor t;
        memset(&t, 0xAB, sizeof t);
        s = mha_safetensors_get_f32(st, name, &t);
        if (s == MHA_OK)
            mha_tensor_free(&t);
        else
            break;
        s = mha_safetensors_view_f32(st, name, &t);
    }
    for (int64_t i = 0; i < mha_safetensors_metadata_count(st); i++)
        (void)mha_safetensors_metadata(st, mha_safetensors_metadata_key(st, i));
    mha_safetensors_free(st);
    return s;
}

static mha_status call_safetensors_write(void *ctx) {
    (void)ctx;
    mha_tensor a, b;
    float *da = test_tensor(&a, 2, (int64_t[]){3, 4}, 11);
    uint8_t mask[6] = {1, 0, 1, 1, 0, 0};
    mha_tensor_init(&b, MHA_BOOL, mask, 2, (int64_t[]){2, 3});
    const char *names[] = {"w", "mask"};
    const mha_tensor *ts[] = {&a, &b};
    const char *keys[] = {"format"}, *values[] = {"pt"};
    mha_status s = mha_safetensors_write(tmp_file(), names, ts, 2, keys, values, 1);
    if (s != MHA_OK)
        check_no_partial_file();
    remove(tmp_file());
    free(da);
    return s;
}

static const char *st_files[] = {"st_dtypes.safetensors", "st_misaligned.safetensors"};

TEST(oom_safetensors_open_get_view_write) {
    for (size_t i = 0; i < sizeof st_files / sizeof *st_files; i++) {
        char path[512], name[128];
        snprintf(path, sizeof path, "%s", fixture(st_files[i]));
        snprintf(name, sizeof name, "mha_safetensors(%s)", st_files[i]);
        if (access(path, R_OK) == 0)
            oom_loop(name, call_safetensors, path);
    }
    oom_loop("mha_safetensors_write", call_safetensors_write, NULL);
}

TEST(io_faults_safetensors_open_get_view_write) {
    for (size_t i = 0; i < sizeof st_files / sizeof *st_files; i++) {
        char path[512], name[128];
        snprintf(path, sizeof path, "%s", fixture(st_files[i]));
        snprintf(name, sizeof name, "mha_safetensors(%s)", st_files[i]);
        if (access(path, R_OK) == 0)
            io_loop(name, call_safetensors, path, false);
    }
    io_loop("mha_safetensors_write", call_safetensors_write, NULL, true);
}

/* ---- layers --------------------------------------------------------------------- */

/* E=8 H=2 F=12, B=2 L=3 (S=4 for the decoder's memory); workspace NULL, so
 * the layer allocates.  variant: 0 encoder layer, 1 decoder layer, 2 encoder
 * stack of 2 with final norm and masks, 3 gated MLP. */
typedef struct layer_ctx {
    int variant;
    float w_in[24 * 8], w_out[64], w1[12 * 8], w2[8 * 12], b1[12], src[2 * 3 * 8],
        mem[2 * 4 * 8], out[2 * 3 * 8];
    uint8_t kpm[2 * 3];
    mha_tensor Win, Wout, W1, W2, B1, Src, Mem, Out, Kpm;
} layer_ctx;

static mha_status call_layer(void *ctx) {
    layer_ctx *c = ctx;
    mha_layer_options opt;
    mha_layer_options_init(&opt);
    opt.num_heads = 2;
    mha_multihead_weights aw = {0};
    aw.in_proj_weight = &c->Win, aw.out_proj_weight = &c->Wout;
    if (c->variant == 1) {
        mha_decoder_layer_weights dw;
        memset(&dw, 0, sizeof dw);
        dw.self_attn = aw, dw.multihead_attn = aw;
        dw.linear1_weight = &c->W1, dw.linear1_bias = &c->B1, dw.linear2_weight = &c->W2;
        mha_layer_masks m = {0};
        m.causal = MHA_CAUSAL_TOP_LEFT;
        return mha_decoder_layer_forward(&c->Out, &c->Src, &c->Mem, &dw, &m, &opt, NULL, 0);
    }
    if (c->variant == 3) {
        mha_mlp_weights mw = {0};
        mw.linear1_weight = &c->W1, mw.linear2_weight = &c->W2, mw.linear3_weight = &c->W1;
        return mha_mlp_forward(&c->Out, &c->Src, &mw, MHA_ACT_SILU, NULL, 0);
    }
    mha_encoder_layer_weights ew;
    memset(&ew, 0, sizeof ew);
    ew.self_attn = aw;
    ew.linear1_weight = &c->W1, ew.linear1_bias = &c->B1, ew.linear2_weight = &c->W2;
    if (c->variant == 0)
        return mha_encoder_layer_forward(&c->Out, &c->Src, &ew, NULL, &opt, NULL, 0);
    mha_encoder_layer_weights layers[2] = {ew, ew};
    mha_encoder_weights stack = {0};
    stack.num_layers = 2, stack.layers = layers, stack.final_norm = 1;
    mha_layer_masks m = {0};
    m.key_padding_mask = &c->Kpm;
    opt.norm_first = 1;
    return mha_encoder_forward(&c->Out, &c->Src, &stack, &m, &opt, NULL, 0);
}

TEST(oom_layers_encoder_decoder_stack_mlp) {
    for (int variant = 0; variant < 4; variant++) {
        layer_ctx c;
        memset(&c, 0, sizeof c);
        c.variant = variant;
        test_randn(c.w_in, 24 * 8, 81), test_randn(c.w_out, 64, 82), test_randn(c.w1, 96, 83);
        test_randn(c.w2, 96, 84), test_randn(c.b1, 12, 85), test_randn(c.src, 48, 86);
        test_randn(c.mem, 64, 87);
        c.kpm[2] = 1;
        mha_tensor_init(&c.Win, MHA_F32, c.w_in, 2, (int64_t[]){24, 8});
        mha_tensor_init(&c.Wout, MHA_F32, c.w_out, 2, (int64_t[]){8, 8});
        mha_tensor_init(&c.W1, MHA_F32, c.w1, 2, (int64_t[]){12, 8});
        mha_tensor_init(&c.W2, MHA_F32, c.w2, 2, (int64_t[]){8, 12});
        mha_tensor_init(&c.B1, MHA_F32, c.b1, 1, (int64_t[]){12});
        mha_tensor_init(&c.Src, MHA_F32, c.src, 3, (int64_t[]){2, 3, 8});
        mha_tensor_init(&c.Mem, MHA_F32, c.mem, 3, (int64_t[]){2, 4, 8});
        mha_tensor_init(&c.Out, MHA_F32, c.out, 3, (int64_t[]){2, 3, 8});
        mha_tensor_init(&c.Kpm, MHA_BOOL, c.kpm, 2, (int64_t[]){2, 3});
        static const char *names[] = {"mha_encoder_layer_forward", "mha_decoder_layer_forward",
                                      "mha_encoder_forward (2 layers, final norm, kpm)",
                                      "mha_mlp_forward (gated)"};
        oom_loop(names[variant], call_layer, &c);
    }
}

/* ---- KV cache and decoding ------------------------------------------------------- */

static mha_status call_kv_cache(void *ctx) {
    (void)ctx;
    float k[2 * 2 * 3 * 4], v[2 * 2 * 3 * 4], q[2 * 4 * 1 * 4], o[2 * 4 * 1 * 4];
    test_randn(k, 48, 91), test_randn(v, 48, 92), test_randn(q, 32, 93);
    mha_tensor K, V, Q, O;
    mha_tensor_init(&K, MHA_F32, k, 4, (int64_t[]){2, 2, 3, 4});
    mha_tensor_init(&V, MHA_F32, v, 4, (int64_t[]){2, 2, 3, 4});
    mha_tensor_init(&Q, MHA_F32, q, 4, (int64_t[]){2, 4, 1, 4});
    mha_tensor_init(&O, MHA_F32, o, 4, (int64_t[]){2, 4, 1, 4});
    mha_kv_cache *cache = (mha_kv_cache *)(uintptr_t)1;
    mha_status st = mha_kv_cache_create(&cache, MHA_F32, 2, 2, 6, 4, 4, 0);
    if (st != MHA_OK) {
        CHECK(cache == NULL);
        return st;
    }
    for (int step = 0; step < 2 && st == MHA_OK; step++) {
        st = mha_kv_cache_append(cache, &K, &V);
        if (st == MHA_OK)
            st = mha_attention_decode(&O, &Q, cache, NULL);
    }
    mha_kv_cache_free(cache);
    return st;
}

TEST(oom_kv_cache_append_decode) { oom_loop("mha_kv_cache create/append/decode", call_kv_cache, NULL); }

/* ---- ONNX Attention ------------------------------------------------------------------ */

static mha_status call_onnx(void *ctx) {
    int variant = *(int *)ctx;
    float q[2 * 4 * 3 * 4], k[2 * 2 * 5 * 4], v[2 * 2 * 5 * 4], y[2 * 4 * 3 * 4];
    float pk[2 * 2 * 2 * 4], pv[2 * 2 * 2 * 4], prk[2 * 2 * 7 * 4], prv[2 * 2 * 7 * 4],
        qk[2 * 4 * 3 * 7], mask[3 * 7];
    test_randn(q, 96, 94), test_randn(k, 80, 95), test_randn(v, 80, 96);
    test_randn(pk, 32, 97), test_randn(pv, 32, 98), test_randn(mask, 21, 99);
    mha_tensor Q, K, V, Y, PK, PV, PRK, PRV, QK, M;
    mha_tensor_init(&Q, MHA_F32, q, 4, (int64_t[]){2, 4, 3, 4});
    mha_tensor_init(&K, MHA_F32, k, 4, (int64_t[]){2, 2, 5, 4});
    mha_tensor_init(&V, MHA_F32, v, 4, (int64_t[]){2, 2, 5, 4});
    mha_tensor_init(&Y, MHA_F32, y, 4, (int64_t[]){2, 4, 3, 4});
    mha_tensor_init(&PK, MHA_F32, pk, 4, (int64_t[]){2, 2, 2, 4});
    mha_tensor_init(&PV, MHA_F32, pv, 4, (int64_t[]){2, 2, 2, 4});
    mha_tensor_init(&PRK, MHA_F32, prk, 4, (int64_t[]){2, 2, 7, 4});
    mha_tensor_init(&PRV, MHA_F32, prv, 4, (int64_t[]){2, 2, 7, 4});
    mha_tensor_init(&QK, MHA_F32, qk, 4, (int64_t[]){2, 4, 3, 7});
    mha_tensor_init(&M, MHA_F32, mask, 2, (int64_t[]){3, 7});
    mha_onnx_attention_options opt;
    mha_onnx_attention_options_init(&opt);
    if (variant == 0)
        return mha_onnx_attention(&Y, NULL, NULL, NULL, &Q, &K, &V, NULL, NULL, NULL, NULL, &opt);
    opt.is_causal = 1, opt.softcap = 2.0f, opt.qk_matmul_output_mode = 3;
    return mha_onnx_attention(&Y, &PRK, &PRV, &QK, &Q, &K, &V, &M, &PK, &PV, NULL, &opt);
}

TEST(oom_onnx_attention) {
    for (int variant = 0; variant < 2; variant++)
        oom_loop(variant ? "mha_onnx_attention (past, mask, softcap, outputs)"
                         : "mha_onnx_attention",
                 call_onnx, &variant);
}

/* ---- the model: create, forward, backward, save, load -------------------------------- */

static mha_status call_model(void *ctx) {
    (void)ctx;
    mha_model_config cfg;
    mha_model_config_init(&cfg);
    cfg.vocab = 7, cfg.max_len = 6, cfg.dim = 8, cfg.heads = 2, cfg.ffn = 12, cfg.layers = 1;
    mha_model *m = (mha_model *)(uintptr_t)1;
    mha_status st = mha_model_create(&m, &cfg, 3);
    if (st != MHA_OK) {
        CHECK(m == NULL);
        return st;
    }
    int64_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3}, targets[2 * 5] = {2, 3, 4, 5, 6, 0, 1, 2, 3, 4};
    float loss;
    st = mha_model_forward(m, tokens, targets, 2, 5, 1, 11, &loss);
    if (st == MHA_OK)
        st = mha_model_backward(m);
    char path[256];
    snprintf(path, sizeof path, "/tmp/mha-oom-model-%d.safetensors", (int)getpid());
    if (st == MHA_OK)
        st = mha_model_save(m, path, NULL, NULL, 1, 3);
    mha_model_free(m);
    if (st == MHA_OK) {
        mha_model *m2 = (mha_model *)(uintptr_t)1;
        st = mha_model_open(&m2, path, NULL, NULL, NULL, NULL);
        if (st == MHA_OK)
            mha_model_free(m2);
        else
            CHECK(m2 == NULL);
    }
    remove(path);
    return st;
}

TEST(oom_model_create_forward_backward_save_load) {
    oom_loop("mha_model create/forward/backward/save/load", call_model, NULL);
}

/* Save then load: a fault while writing is MHA_ERR_IO; while reading the
 * reader's rules apply.  Any of OK / IO / FORMAT, never a crash or leak. */
TEST(io_faults_model_save_load) {
    static const mha_io_fault faults[] = {MHA_IO_FAULT_FAIL, MHA_IO_FAULT_SHORT, MHA_IO_FAULT_EOF};
    for (int f = 0; f < 3; f++)
        for (int persistent = 0; persistent <= 1; persistent++)
            for (int64_t k = 1; k < 100000; k++) {
                int64_t live0 = mha_test_live_allocs(), count0 = mha_test_io_count();
                mha_test_fail_io(k, persistent, faults[f]);
                mha_status st = call_model(NULL);
                mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
                CHECK(mha_test_live_allocs() == live0);
                if (mha_test_io_count() - count0 < k) {
                    CHECK_STATUS(st, MHA_OK);
                    break;
                }
                io_points++;
                CHECK(st == MHA_OK || st == MHA_ERR_IO || st == MHA_ERR_FORMAT);
                if (test_failures() > 20)
                    return;
            }
}

/* Regression: a header with more than 8 __metadata__ pairs grew the pair
 * table while copying one element past the old one (heap over-read, found
 * by oom_model_create_forward_backward_save_load under ASan). */
TEST(regression_safetensors_many_metadata_pairs) {
    float x[3] = {1, 2, 3};
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 1, (int64_t[]){3});
    const char *names[] = {"x"};
    const mha_tensor *ts[] = {&t};
    char kb[40][16], vb[40][16];
    const char *keys[40], *values[40];
    for (int i = 0; i < 40; i++) {
        snprintf(kb[i], sizeof kb[i], "k%d", i), snprintf(vb[i], sizeof vb[i], "v%d", i);
        keys[i] = kb[i], values[i] = vb[i];
    }
    REQUIRE_OK(mha_safetensors_write(tmp_file(), names, ts, 1, keys, values, 40));
    mha_safetensors *st = NULL;
    CHECK_STATUS(mha_safetensors_open(&st, tmp_file()), MHA_OK);
    CHECK(mha_safetensors_metadata_count(st) == 40);
    CHECK(st && mha_safetensors_metadata(st, "k39") && !strcmp(mha_safetensors_metadata(st, "k39"), "v39"));
    mha_safetensors_free(st);
    remove(tmp_file());
}

/* Runs last (tests run in name order): the figure for the report. */
TEST(zz_oom_injection_point_count) {
    printf("oom: %lld injection points (%lld allocation, %lld i/o)\n",
           (long long)(alloc_points + io_points), (long long)alloc_points, (long long)io_points);
    CHECK(alloc_points > 0);
}
