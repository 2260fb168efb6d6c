/* test_io_npy.c - .npy reader and writer: NumPy-written files load exactly,
 * mha's files are byte-identical to numpy.save, float16 rounding matches
 * NumPy on every half and on random floats, injected I/O and allocation
 * failures end cleanly.  Files: tests/fixtures/io (gen_io_fixtures.py). */
#include "test.h"

#include "io/io.h"

static const char *io_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/io/%s", test_fixture_root(), name);
    return buf;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(sz > 0 ? (size_t)sz : 1);
    *n = b ? fread(b, 1, (size_t)sz, f) : 0;
    fclose(f);
    return b;
}

static bool same_files(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    if (!same && x && y)
        for (size_t i = 0; i < na && i < nb; i++)
            if (x[i] != y[i]) {
                fprintf(stderr, "  %s vs %s differ at byte %zu\n", a, b, i);
                break;
            }
    free(x);
    free(y);
    return same;
}

/* The generator's formulas (see gen_io_fixtures.py). */
static double expect(const char *tag, int64_t i) {
    if (!strcmp(tag, "b1"))
        return i % 3 == 0;
    if (!strcmp(tag, "u1"))
        return (double)(i % 251);
    if (!strcmp(tag, "i4") || !strcmp(tag, "i8"))
        return (double)(i - 7);
    return (double)(i - 7) * 0.25;
}

TEST(npy_numpy_dtypes_load_as_float_bool_int) {
    static const char *tags[] = {"f4", "f8", "f2", "b1", "u1", "i4", "i8"};
    for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) {
        char name[64];
        snprintf(name, sizeof name, "np_%s_3x5.npy", tags[t]);
        mha_tensor x;
        REQUIRE_OK(mha_npy_load(&x, io_path(name), MHA_F32));
        CHECK(x.dtype == MHA_F32 && x.ndim == 2 && x.shape[0] == 3 && x.shape[1] == 5);
        for (int64_t i = 0; i < 15; i++)
            CHECK(((float *)x.data)[i] == (float)expect(tags[t], i));
        mha_tensor_free(&x);

        REQUIRE_OK(mha_npy_load(&x, io_path(name), MHA_BOOL));
        for (int64_t i = 0; i < 15; i++)
            CHECK(((uint8_t *)x.data)[i] == (expect(tags[t], i) != 0));
        mha_tensor_free(&x);

        mha_dtype fd;
        REQUIRE_OK(mha_npy_load_any(&x, &fd, io_path(name), 1));
        bool is_float = tags[t][0] == 'f';
        CHECK(x.dtype == (is_float ? MHA_F32 : MHA_BOOL));
        CHECK(fd == (!strcmp(tags[t], "f2") ? MHA_F16
                     : is_float             ? MHA_F32
                     : tags[t][0] == 'b'    ? MHA_BOOL
                                            : MHA_I64));
        mha_tensor_free(&x);

        mha_status st = mha_npy_load(&x, io_path(name), MHA_I64);
        if (is_float) {
            CHECK(st == MHA_ERR_DTYPE);
            CHECK(x.data == NULL);
        } else {
            CHECK(st == MHA_OK);
            for (int64_t i = 0; st == MHA_OK && i < 15; i++)
                CHECK(((int64_t *)x.data)[i] == (int64_t)expect(tags[t], i));
            mha_tensor_free(&x);
        }
    }
}

TEST(npy_shapes_versions_and_fortran_order) {
    static const struct {
        const char *file;
        int ndim;
        int64_t shape[4];
    } cases[] = {
        {"np_f4_scalar.npy", 0, {0}},          {"np_f4_7.npy", 1, {7}},
        {"np_f4_7x8.npy", 2, {7, 8}},          {"np_f4_2x3x4x5.npy", 4, {2, 3, 4, 5}},
        {"np_f4_0x3.npy", 2, {0, 3}},          {"np_f4_3x5_v2.npy", 2, {3, 5}},
        {"np_f4_3x5_v3.npy", 2, {3, 5}},       {"np_f4_3x5_fortran.npy", 2, {3, 5}},
        {"np_f8_2x3x4_fortran.npy", 3, {2, 3, 4}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        mha_tensor x;
        REQUIRE_OK(mha_npy_load(&x, io_path(cases[c].file), MHA_F32));
        CHECK(x.ndim == cases[c].ndim);
        int64_t n = 1;
        for (int k = 0; k < x.ndim; k++) {
            CHECK(x.shape[k] == cases[c].shape[k]);
            n *= x.shape[k];
        }
        for (int64_t i = 0; i < n; i++)
            if (((float *)x.data)[i] != (float)expect("f4", i)) {
                test_fail(__FILE__, __LINE__, "%s: element %lld is %g", cases[c].file,
                          (long long)i, ((float *)x.data)[i]);
                break;
            }
        mha_tensor_free(&x);
    }
    mha_tensor x;
    CHECK_STATUS(mha_npy_load(&x, io_path("np_f4_3x5_bigendian.npy"), MHA_F32),
                 MHA_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("big-endian");
    CHECK_STATUS(mha_npy_load(&x, io_path("no_such_file.npy"), MHA_F32), MHA_ERR_IO);
    CHECK_ERROR_MENTIONS("no_such_file.npy");
}

static void fill_expect(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)expect("f4", i);
}

TEST(npy_writer_is_byte_identical_to_numpy_save) {
    static const struct {
        const char *file;
        int ndim;
        int64_t shape[4];
        mha_dtype as;
    } cases[] = {
        {"np_f4_scalar.npy", 0, {0}, MHA_F32},   {"np_f4_7.npy", 1, {7}, MHA_F32},
        {"np_f4_7x8.npy", 2, {7, 8}, MHA_F32},   {"np_f4_2x3x4x5.npy", 4, {2, 3, 4, 5}, MHA_F32},
        {"np_f4_0x3.npy", 2, {0, 3}, MHA_F32},   {"np_f2_7x8.npy", 2, {7, 8}, MHA_F16},
        {"np_b1_7x8.npy", 2, {7, 8}, MHA_BOOL},
    };
    const char *tmp = "build-test-npy.npy";
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float v[120];
        uint8_t b[120];
        fill_expect(v, 120);
        for (int i = 0; i < 120; i++)
            b[i] = (uint8_t)(i % 3 == 0);
        mha_tensor t;
        REQUIRE_OK(mha_tensor_init(&t, cases[c].as == MHA_BOOL ? MHA_BOOL : MHA_F32,
                                   cases[c].as == MHA_BOOL ? (void *)b : (void *)v,
                                   cases[c].ndim, cases[c].shape));
        REQUIRE_OK(mha_npy_save(&t, tmp, cases[c].as));
        if (!same_files(tmp, io_path(cases[c].file)))
            test_fail(__FILE__, __LINE__, "mha_npy_save differs from numpy for %s",
                      cases[c].file);
    }
    /* a strided (transposed) view is written in its logical C order */
    float v[15], tr[15];
    fill_expect(v, 15);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++)
            tr[j * 3 + i] = v[i * 5 + j];
    mha_tensor t;
    REQUIRE_OK(mha_tensor_init(&t, MHA_F32, tr, 2, (int64_t[]){3, 5}));
    t.stride[0] = 1, t.stride[1] = 3;
    REQUIRE_OK(mha_npy_save(&t, tmp, MHA_F32));
    CHECK(same_files(tmp, io_path("np_f4_3x5.npy")));
    /* wrong dtype pairs are refused and leave no file */
    remove(tmp);
    CHECK_STATUS(mha_npy_save(&t, tmp, MHA_I64), MHA_ERR_DTYPE);
    FILE *f = fopen(tmp, "rb");
    CHECK(f == NULL);
    if (f)
        fclose(f);
    remove(tmp);
}

TEST(npy_float16_conversions_match_numpy) {
    mha_tensor h, f;
    REQUIRE_OK(mha_npy_load(&h, io_path("np_f2_all.npy"), MHA_F32));
    REQUIRE_OK(mha_npy_load(&f, io_path("np_f2_all_as_f4.npy"), MHA_F32));
    REQUIRE(h.shape[0] == 65536 && f.shape[0] == 65536);
    int bad = 0;
    for (int64_t i = 0; i < 65536; i++) {
        uint32_t a, b;
        memcpy(&a, (float *)h.data + i, 4);
        memcpy(&b, (float *)f.data + i, 4);
        bad += a != b;
    }
    CHECK(bad == 0);
    mha_tensor_free(&h);
    mha_tensor_free(&f);

    REQUIRE_OK(mha_npy_load(&f, io_path("np_f4_rounding.npy"), MHA_F32));
    REQUIRE_OK(mha_npy_load(&h, io_path("np_f4_rounding_as_f2.npy"), MHA_F16));
    REQUIRE(f.shape[0] == h.shape[0] && h.dtype == MHA_F16);
    bad = 0;
    for (int64_t i = 0; i < f.shape[0]; i++) {
        uint16_t got = mha_float_to_half(((float *)f.data)[i]);
        if (got != ((uint16_t *)h.data)[i] && bad++ < 5)
            fprintf(stderr, "  half(%a) = %04x, numpy %04x\n", ((float *)f.data)[i], got,
                    ((uint16_t *)h.data)[i]);
    }
    CHECK(bad == 0);
    mha_tensor_free(&h);
    mha_tensor_free(&f);
}

TEST(npy_bfloat16_and_nan_conversions) {
    CHECK(mha_bf16_to_float(0x3f80) == 1.0f);
    CHECK(mha_bf16_to_float(0xc040) == -3.0f);
    CHECK(isnan(mha_half_to_float(mha_float_to_half(NAN))));
    CHECK(mha_float_to_half(-0.0f) == 0x8000);
    CHECK(mha_half_to_float(0x0001) == 0x1p-24f);
}

/* Every read of a load failing (or short, or at EOF) ends with a clean status;
 * short reads are retried and give the same tensor. */
TEST(npy_io_fault_injection) {
    static const char *files[] = {"np_f4_3x5_v2.npy", "np_f8_2x3x4_fortran.npy", "np_b1_7x8.npy"};
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        mha_tensor ref;
        REQUIRE_OK(mha_npy_load(&ref, io_path(files[fi]), MHA_F32));
        int64_t before = mha_test_io_count();
        mha_tensor x;
        REQUIRE_OK(mha_npy_load(&x, io_path(files[fi]), MHA_F32));
        int64_t reads = mha_test_io_count() - before;
        mha_tensor_free(&x);
        CHECK(reads >= 2);
        for (int fault = 0; fault < 3; fault++)
            for (int64_t k = 1; k <= reads + 1; k++) {
                mha_test_fail_io(k, fault == MHA_IO_FAULT_FAIL, (mha_io_fault)fault);
                mha_status st = mha_npy_load(&x, io_path(files[fi]), MHA_F32);
                mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
                if (fault == MHA_IO_FAULT_SHORT || k > reads) {
                    CHECK(st == MHA_OK);
                } else {
                    CHECK(st == (fault == MHA_IO_FAULT_FAIL ? MHA_ERR_IO : MHA_ERR_FORMAT));
                    CHECK(x.data == NULL);
                }
                if (st == MHA_OK) {
                    CHECK(!memcmp(x.data, ref.data, (size_t)ref.shape[0] * 4));
                    mha_tensor_free(&x);
                }
            }
        mha_tensor_free(&ref);
    }
}

TEST(npy_allocation_failures_are_clean) {
    int injected = 0;
    for (int64_t k = 1; k <= 4; k++) {
        mha_tensor x;
        mha_test_fail_alloc(k, 1);
        mha_status st = mha_npy_load(&x, io_path("np_f8_2x3x4_fortran.npy"), MHA_F32);
        mha_test_fail_alloc(0, 0);
        CHECK(st == MHA_OK || st == MHA_ERR_NOMEM);
        injected += st == MHA_ERR_NOMEM;
        if (st == MHA_OK)
            mha_tensor_free(&x);
        else
            CHECK(x.data == NULL);
    }
    CHECK(injected > 0); /* the hook is live in this build */
}
