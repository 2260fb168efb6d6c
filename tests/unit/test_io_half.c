/* test_io_half.c - half-precision tensors in files: .npy '<f2' and bfloat16
 * as raw '<u2' bits (load, load_any, save byte-identical to numpy.save,
 * rounding to bfloat16 bit-exact with torch: ties to even, overflow to inf,
 * subnormals, NaN stays NaN), wrong kinds refused; safetensors F16/BF16 as
 * zero-copy native views (2-byte alignment is enough; misaligned or unmapped
 * tensors are copied) and BF16 written as "BF16".
 * Files: tests/fixtures/half (gen_half_fixtures.py: NumPy and torch). */
#include "test.h"

#include "io/io.h"

#include <unistd.h>

static const char *half_path(const char *name) {
    static char buf[2][512];
    static int which;
    which ^= 1;
    snprintf(buf[which], sizeof buf[which], "%s/half/%s", test_fixture_root(), name);
    return buf[which];
}

/* A fresh temporary directory for the files a test writes; rmdir'd by done_tmp. */
static char tmp_dir[256];
static const char *make_tmp(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "%s/mha-half-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(tmp_dir);
}
static const char *tmp_file(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmp_dir, name);
    return buf;
}

static bool same_bytes(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* Elements of t, a contiguous 2-byte tensor, that differ from ref's (both
 * loaded with the same shape); prints the first few. */
static int64_t bits_differ(const mha_tensor *t, const mha_tensor *ref, const float *src) {
    int64_t n, bad = 0;
    if (mha_tensor_numel(t, &n) != MHA_OK)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        uint16_t a = ((const uint16_t *)t->data)[i], b = ((const uint16_t *)ref->data)[i];
        if (a != b && bad++ < 5)
            fprintf(stderr, "  element %lld (%a): %04x, want %04x\n", (long long)i,
                    src ? (double)src[i] : 0.0, a, b);
    }
    return bad;
}

TEST(npy_bf16_u2_loads_as_raw_bits_and_as_floats) {
    mha_tensor b, f;
    REQUIRE_OK(mha_npy_load(&b, half_path("np_u2_bf16_3x5.npy"), MHA_BF16));
    CHECK(b.dtype == MHA_BF16 && b.ndim == 2 && b.shape[0] == 3 && b.shape[1] == 5);
    for (int64_t i = 0; i < 15; i++) /* (i - 7) / 4: exact in bfloat16 */
        CHECK(mha_bf16_to_float(((uint16_t *)b.data)[i]) == (float)(i - 7) * 0.25f);
    REQUIRE_OK(mha_npy_load(&f, half_path("np_u2_bf16_3x5.npy"), MHA_F32));
    CHECK(f.dtype == MHA_F32);
    for (int64_t i = 0; i < 15; i++)
        CHECK(((float *)f.data)[i] == (float)(i - 7) * 0.25f);
    mha_tensor_free(&f);
    /* load_any keeps float32 and reports bfloat16 */
    mha_dtype fd = MHA_F32;
    REQUIRE_OK(mha_npy_load_any(&f, &fd, half_path("np_u2_bf16_3x5.npy"), 0));
    CHECK(fd == MHA_BF16 && f.dtype == MHA_F32 && ((float *)f.data)[14] == 1.75f);
    mha_tensor_free(&f);
    REQUIRE_OK(mha_npy_load_any(&f, &fd, half_path("attn_q_f16.npy"), 0));
    CHECK(fd == MHA_F16 && f.dtype == MHA_F32);
    mha_tensor_free(&f);
    /* as float16: exact here */
    REQUIRE_OK(mha_npy_load(&f, half_path("np_u2_bf16_3x5.npy"), MHA_F16));
    CHECK(f.dtype == MHA_F16 && mha_half_to_float(((uint16_t *)f.data)[0]) == -1.75f);
    mha_tensor_free(&f);
    mha_tensor_free(&b);
}

TEST(npy_f2_loads_as_f16_unchanged) {
    mha_tensor h, f;
    REQUIRE_OK(mha_npy_load(&h, half_path("np_f2_finite.npy"), MHA_F16));
    REQUIRE_OK(mha_npy_load(&f, half_path("np_f2_finite.npy"), MHA_F32));
    REQUIRE(h.dtype == MHA_F16 && h.shape[0] == f.shape[0] && h.shape[0] > 63000);
    int64_t bad = 0;
    for (int64_t i = 0; i < h.shape[0]; i++) { /* the bits, copied: f32 -> f16 exact */
        float x = ((float *)f.data)[i];
        bad += mha_float_to_half(x) != ((uint16_t *)h.data)[i];
    }
    CHECK(bad == 0);
    /* every finite half to bfloat16: torch's rounding, bit for bit */
    mha_tensor b, want;
    REQUIRE_OK(mha_npy_load(&b, half_path("np_f2_finite.npy"), MHA_BF16));
    REQUIRE_OK(mha_npy_load(&want, half_path("np_f2_finite_as_bf16.npy"), MHA_BF16));
    CHECK(bits_differ(&b, &want, f.data) == 0);
    mha_tensor_free(&b);
    mha_tensor_free(&want);
    mha_tensor_free(&h);
    mha_tensor_free(&f);
}

/* float32 and float64 files to bfloat16 match torch: ties to even
 * (1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6), overflow past the largest
 * bfloat16 to inf, subnormals, signed zeros, random bit patterns; float64
 * goes through float32 as torch does (1 + 2^-8 + 2^-30 -> 1). */
TEST(npy_float_files_round_to_bf16_as_torch) {
    static const char *cases[][2] = {
        {"np_f4_bf16_rounding.npy", "np_f4_bf16_rounding_as_bf16.npy"},
        {"np_f8_bf16_rounding.npy", "np_f8_bf16_rounding_as_bf16.npy"},
    };
    for (int c = 0; c < 2; c++) {
        mha_tensor src, b, want;
        REQUIRE_OK(mha_npy_load(&src, half_path(cases[c][0]), MHA_F32));
        REQUIRE_OK(mha_npy_load(&b, half_path(cases[c][0]), MHA_BF16));
        REQUIRE_OK(mha_npy_load(&want, half_path(cases[c][1]), MHA_BF16));
        REQUIRE(b.dtype == MHA_BF16 && b.shape[0] == want.shape[0] && b.shape[0] > 10);
        CHECK(bits_differ(&b, &want, src.data) == 0);
        mha_tensor_free(&src);
        mha_tensor_free(&b);
        mha_tensor_free(&want);
    }
    /* the named edge cases, from the first rows of the float32 file */
    mha_tensor b;
    REQUIRE_OK(mha_npy_load(&b, half_path("np_f4_bf16_rounding.npy"), MHA_BF16));
    const uint16_t *u = b.data;
    CHECK(u[0] == 0x3f80);                    /* 1 + 2^-8: tie, to even (down)   */
    CHECK(u[1] == 0x3f82);                    /* 1 + 3*2^-8: tie, to even (up)   */
    CHECK(u[5] == 0x7f7f);                    /* the largest bfloat16             */
    CHECK(u[6] == 0x7f80 && u[8] == 0x7f80);  /* past it: inf                     */
    CHECK(u[9] == 0xff80);                    /* -FLT_MAX: -inf                   */
    CHECK(u[11] == 0x0008 && u[12] == 0x0003); /* subnormals                     */
    CHECK(u[13] == 0x0000 && u[14] == 0x8000); /* below half the least: +-0      */
    mha_tensor_free(&b);
}

/* Saving: MHA_BF16 as '<u2' raw bits byte-identical to numpy.save of the
 * uint16 view; float32 as BF16 rounds (the torch bits); as F16 it matches
 * numpy's astype(float16) file; NaN stays NaN through every path. */
TEST(npy_save_half_byte_identical_to_numpy) {
    REQUIRE(make_tmp() != NULL);
    mha_tensor b, f;
    REQUIRE_OK(mha_npy_load(&b, half_path("np_u2_bf16_3x5.npy"), MHA_BF16));
    REQUIRE_OK(mha_npy_save(&b, tmp_file("b.npy"), MHA_BF16));
    CHECK(same_bytes(tmp_file("b.npy"), half_path("np_u2_bf16_3x5.npy")));
    REQUIRE_OK(mha_npy_load(&f, half_path("np_u2_bf16_3x5.npy"), MHA_F32));
    REQUIRE_OK(mha_npy_save(&f, tmp_file("f.npy"), MHA_BF16));
    CHECK(same_bytes(tmp_file("f.npy"), half_path("np_u2_bf16_3x5.npy")));
    /* a strided 1-D view: the first 7 elements of row-major data, step 1 */
    mha_tensor row = b;
    row.ndim = 1, row.shape[0] = 7, row.stride[0] = 1;
    REQUIRE_OK(mha_npy_save(&row, tmp_file("r.npy"), MHA_BF16));
    CHECK(same_bytes(tmp_file("r.npy"), half_path("np_u2_bf16_7.npy")));
    /* bf16 as float32: exact widening */
    REQUIRE_OK(mha_npy_save(&b, tmp_file("w.npy"), MHA_F32));
    mha_tensor w;
    REQUIRE_OK(mha_npy_load(&w, tmp_file("w.npy"), MHA_F32));
    CHECK(test_max_diff(w.data, f.data, 15) == 0.0);
    mha_tensor_free(&w);
    mha_tensor_free(&b);
    mha_tensor_free(&f);

    /* float32 rounded on save, to bf16 (torch) and to f16 (numpy) */
    REQUIRE_OK(mha_npy_load(&f, half_path("np_f4_bf16_rounding.npy"), MHA_F32));
    REQUIRE_OK(mha_npy_save(&f, tmp_file("rb.npy"), MHA_BF16));
    CHECK(same_bytes(tmp_file("rb.npy"), half_path("np_f4_bf16_rounding_as_bf16.npy")));
    mha_tensor_free(&f);
    REQUIRE_OK(mha_npy_load(&f, half_path("np_f2_finite.npy"), MHA_F32));
    REQUIRE_OK(mha_npy_save(&f, tmp_file("rh.npy"), MHA_F16));
    CHECK(same_bytes(tmp_file("rh.npy"), half_path("np_f2_finite.npy")));
    mha_tensor_free(&f);

    /* NaN (quiet and signalling, either sign) stays NaN in bf16 and f16 */
    static const uint32_t nan_bits[4] = {0x7fc00000u, 0x7f800001u, 0xffc00123u, 0x7fbfffffu};
    float nans[4];
    memcpy(nans, nan_bits, sizeof nans);
    mha_tensor n;
    REQUIRE_OK(mha_tensor_init(&n, MHA_F32, nans, 1, (int64_t[]){4}));
    const mha_dtype as[2] = {MHA_BF16, MHA_F16};
    for (int k = 0; k < 2; k++) {
        REQUIRE_OK(mha_npy_save(&n, tmp_file("n.npy"), as[k]));
        mha_tensor back;
        REQUIRE_OK(mha_npy_load(&back, tmp_file("n.npy"), MHA_F32));
        for (int i = 0; i < 4; i++)
            CHECK(isnan(((float *)back.data)[i]));
        mha_tensor_free(&back);
    }
    remove(tmp_file("b.npy")), remove(tmp_file("f.npy")), remove(tmp_file("r.npy"));
    remove(tmp_file("w.npy")), remove(tmp_file("rb.npy")), remove(tmp_file("rh.npy"));
    remove(tmp_file("n.npy"));
    rmdir(tmp_dir);
}

/* Round trips: f16 and bf16 tensors through .npy keep every bit. */
TEST(npy_half_round_trips) {
    REQUIRE(make_tmp() != NULL);
    const mha_dtype dts[2] = {MHA_F16, MHA_BF16};
    for (int k = 0; k < 2; k++) {
        mha_tensor t, back;
        REQUIRE_OK(mha_tensor_create(&t, dts[k], 2, (int64_t[]){257, 255}));
        uint16_t *u = t.data;
        for (int64_t i = 0; i < 257 * 255; i++)
            u[i] = (uint16_t)(i * 40503u); /* every bit pattern region, NaNs included */
        REQUIRE_OK(mha_npy_save(&t, tmp_file("t.npy"), dts[k]));
        REQUIRE_OK(mha_npy_load(&back, tmp_file("t.npy"), dts[k]));
        CHECK(back.dtype == dts[k] && back.shape[0] == 257 && back.shape[1] == 255);
        CHECK(!memcmp(back.data, t.data, sizeof(uint16_t) * 257 * 255));
        mha_tensor_free(&back);
        mha_tensor_free(&t);
    }
    remove(tmp_file("t.npy"));
    rmdir(tmp_dir);
}

TEST(npy_half_wrong_kinds_refused) {
    REQUIRE(make_tmp() != NULL);
    mha_tensor x;
    /* '<u2' is bfloat16 in mha: not integers */
    CHECK_STATUS(mha_npy_load(&x, half_path("np_u2_bf16_3x5.npy"), MHA_I64), MHA_ERR_DTYPE);
    CHECK_ERROR_MENTIONS("bfloat16");
    CHECK(x.data == NULL);
    /* a bool tensor is not written as bf16, a bf16 one not as bool */
    uint8_t flags[3] = {1, 0, 1};
    mha_tensor m;
    REQUIRE_OK(mha_tensor_init(&m, MHA_BOOL, flags, 1, (int64_t[]){3}));
    CHECK_STATUS(mha_npy_save(&m, tmp_file("x.npy"), MHA_BF16), MHA_ERR_DTYPE);
    CHECK_ERROR_MENTIONS("BOOL as BOOL");
    uint16_t hb[3] = {0x3f80, 0, 0x4000};
    mha_tensor h;
    REQUIRE_OK(mha_tensor_init(&h, MHA_BF16, hb, 1, (int64_t[]){3}));
    CHECK_STATUS(mha_npy_save(&h, tmp_file("x.npy"), MHA_BOOL), MHA_ERR_DTYPE);
    CHECK_STATUS(mha_npy_save(&h, tmp_file("x.npy"), MHA_I64), MHA_ERR_DTYPE);
    FILE *f = fopen(tmp_file("x.npy"), "rb"); /* refused before anything is written */
    CHECK(f == NULL);
    if (f)
        fclose(f);
    /* other 2-byte integers stay unsupported, naming what is read */
    static const char i2[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<i2', 'fortran_order': False, "
                             "'shape': (1,), }";
    char file[128];
    memset(file, ' ', sizeof file);
    memcpy(file, i2, sizeof i2 - 1);
    file[127] = '\n';
    FILE *w = fopen(tmp_file("i2.npy"), "wb");
    REQUIRE(w != NULL);
    fwrite(file, 1, 128, w);
    fwrite("\x01\x00", 1, 2, w);
    fclose(w);
    CHECK_STATUS(mha_npy_load(&x, tmp_file("i2.npy"), MHA_BF16), MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("<u2 (bfloat16 bits)");
    remove(tmp_file("i2.npy"));
    rmdir(tmp_dir);
}

/* ---- safetensors ------------------------------------------------------------ */

static void check_values(const mha_tensor *t, mha_dtype dt) {
    CHECK(t->dtype == dt && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5);
    for (int64_t i = 0; i < 15; i++)
        CHECK(mha_load_f(t->data, dt, i) == (float)(i - 7) * 0.25f);
}

/* Zero-copy: a second view of the same tensor is the same pointer (each
 * copy is a new buffer). */
static bool same_view(mha_safetensors *st, const char *name, const mha_tensor *first) {
    mha_tensor again;
    return mha_safetensors_view(st, name, &again) == MHA_OK && again.data == first->data;
}

TEST(safetensors_native_half_views_zero_copy) {
    const char *path = half_path("st_half_align.safetensors");
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, path));
    mha_tensor h, b, c, f;
    REQUIRE_OK(mha_safetensors_view(st, "h_f16", &h));   /* odd offset: copied */
    REQUIRE_OK(mha_safetensors_view(st, "b_bf16", &b));  /* 2 mod 4: zero-copy */
    REQUIRE_OK(mha_safetensors_view(st, "c_f32", &c));
    check_values(&h, MHA_F16);
    check_values(&b, MHA_BF16);
    check_values(&c, MHA_F32);
    CHECK(((uintptr_t)h.data & 1) == 0);
    CHECK(((uintptr_t)b.data & 3) == 2); /* a half tensor needs only 2-byte alignment */
    CHECK(same_view(st, "b_bf16", &b) && same_view(st, "c_f32", &c));
    CHECK(!same_view(st, "h_f16", &h));
    CHECK((const char *)c.data - (const char *)b.data == 30); /* one mapping: 64 - 34 */
    /* the float32 view converts */
    REQUIRE_OK(mha_safetensors_view_f32(st, "b_bf16", &f));
    check_values(&f, MHA_F32);
    /* no native view for non-float dtypes */
    CHECK_STATUS(mha_safetensors_view(st, "a_u8", &f), MHA_ERR_DTYPE);
    CHECK_ERROR_MENTIONS("mha_safetensors_view_f32");
    CHECK(f.data == NULL);
    CHECK_STATUS(mha_safetensors_view(st, "nope", &f), MHA_ERR_VALUE);
    mha_safetensors_free(st);

    /* without a mapping (a failed map attempt), every view is an aligned copy */
    int copies = 0;
    for (int64_t k = 1; k <= 4; k++) {
        mha_test_fail_io(k, 0, MHA_IO_FAULT_FAIL);
        mha_status s = mha_safetensors_open(&st, path);
        mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
        if (s != MHA_OK)
            continue;
        REQUIRE_OK(mha_safetensors_view(st, "b_bf16", &b));
        check_values(&b, MHA_BF16);
        copies += !same_view(st, "b_bf16", &b);
        mha_safetensors_free(st);
    }
    CHECK(copies >= 1);
}

TEST(safetensors_write_bf16_and_f16) {
    REQUIRE(make_tmp() != NULL);
    uint16_t hb[6], hh[6];
    for (int i = 0; i < 6; i++) {
        hb[i] = mha_float_to_bf16((float)i - 2.5f);
        hh[i] = mha_float_to_half((float)i * 0.125f);
    }
    mha_tensor b, h;
    REQUIRE_OK(mha_tensor_init(&b, MHA_BF16, hb, 2, (int64_t[]){2, 3}));
    REQUIRE_OK(mha_tensor_init(&h, MHA_F16, hh, 1, (int64_t[]){6}));
    const char *names[2] = {"b", "h"};
    const mha_tensor *ts[2] = {&b, &h};
    REQUIRE_OK(mha_safetensors_write(tmp_file("w.safetensors"), names, ts, 2, NULL, NULL, 0));
    char *file = test_slurp(tmp_file("w.safetensors"), NULL);
    REQUIRE(file != NULL);
    CHECK(strstr(file + 8, "\"b\":{\"dtype\":\"BF16\"") != NULL);
    CHECK(strstr(file + 8, "\"h\":{\"dtype\":\"F16\"") != NULL);
    free(file);
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, tmp_file("w.safetensors")));
    const char *dt;
    REQUIRE_OK(mha_safetensors_info(st, mha_safetensors_find(st, "b"), &dt, NULL, NULL));
    CHECK(!strcmp(dt, "BF16"));
    mha_tensor vb, vh;
    REQUIRE_OK(mha_safetensors_view(st, "b", &vb));
    REQUIRE_OK(mha_safetensors_view(st, "h", &vh));
    CHECK(vb.dtype == MHA_BF16 && vb.shape[0] == 2 && !memcmp(vb.data, hb, sizeof hb));
    CHECK(vh.dtype == MHA_F16 && vh.shape[0] == 6 && !memcmp(vh.data, hh, sizeof hh));
    mha_safetensors_free(st);
    remove(tmp_file("w.safetensors"));
    rmdir(tmp_dir);
}
