/* test_io_safetensors.c - safetensors reader and writer: every dtype of a
 * Python-written file converts exactly, views map aligned F32 tensors and
 * copy misaligned ones, write -> read is identical, metadata round-trips,
 * injected I/O and allocation failures end cleanly. */
#include "test.h"

#include "io/io.h"

static const char *st_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/io/%s", test_fixture_root(), name);
    return buf;
}

TEST(safetensors_python_file_dtypes_convert_exactly) {
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, st_path("st_dtypes.safetensors")));
    CHECK(mha_safetensors_count(st) == 8);
    static const char *names[] = {"f32", "f16", "bf16", "f64", "i64", "u8"};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
        mha_tensor t;
        REQUIRE_OK(mha_safetensors_get_f32(st, names[n], &t));
        CHECK(t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 5);
        for (int i = 0; i < 15; i++) {
            float want = names[n][0] == 'i' ? (float)(i - 7)
                         : names[n][0] == 'u' ? (float)i
                                              : (float)(i - 7) * 0.25f;
            CHECK(((float *)t.data)[i] == want);
        }
        mha_tensor_free(&t);
    }
    mha_tensor t;
    REQUIRE_OK(mha_safetensors_get_f32(st, "scalar", &t));
    CHECK(t.ndim == 0 && ((float *)t.data)[0] == -1.75f);
    mha_tensor_free(&t);
    REQUIRE_OK(mha_safetensors_get_f32(st, "empty", &t));
    CHECK(t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 4);
    mha_tensor_free(&t);
    CHECK_STATUS(mha_safetensors_get_f32(st, "nope", &t), MHA_ERR_VALUE);
    CHECK_ERROR_MENTIONS("nope");

    const char *dt;
    int nd;
    int64_t shape[MHA_SAFETENSORS_MAX_DIMS];
    int64_t i = mha_safetensors_find(st, "bf16");
    REQUIRE(i >= 0);
    REQUIRE_OK(mha_safetensors_info(st, i, &dt, &nd, shape));
    CHECK(!strcmp(dt, "BF16") && nd == 2 && shape[0] == 3 && shape[1] == 5);
    CHECK(mha_safetensors_metadata_count(st) == 2);
    CHECK(!strcmp(mha_safetensors_metadata(st, "format"), "pt"));
    CHECK(!strcmp(mha_safetensors_metadata(st, "note"), "caf\xc3\xa9 \"quoted\""));
    CHECK(mha_safetensors_metadata(st, "absent") == NULL);
    mha_safetensors_free(st);
}

TEST(safetensors_views_map_aligned_and_copy_misaligned) {
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, st_path("st_misaligned.safetensors")));
    mha_tensor v;
    REQUIRE_OK(mha_safetensors_view_f32(st, "b_f32", &v));
    CHECK(((uintptr_t)v.data & 3) == 0);
    for (int i = 0; i < 15; i++)
        CHECK(((float *)v.data)[i] == (float)(i - 7) * 0.25f);
    REQUIRE_OK(mha_safetensors_view_f32(st, "a_u8", &v));
    CHECK(((float *)v.data)[2] == 3.0f);
    mha_safetensors_free(st);

    REQUIRE_OK(mha_safetensors_open(&st, st_path("st_dtypes.safetensors")));
    REQUIRE_OK(mha_safetensors_view_f32(st, "f32", &v));
    CHECK(((float *)v.data)[14] == 1.75f);
    mha_safetensors_free(st);
}

TEST(safetensors_write_read_round_trip) {
    float a[2 * 3 * 4], b[5];
    test_randn(a, 24, 7);
    test_randn(b, 5, 8);
    uint8_t m[6] = {1, 0, 0, 1, 1, 0};
    int64_t ids[3] = {-5, 0, 123456789};
    mha_tensor ta, tb, tbt, tm, ti;
    REQUIRE_OK(mha_tensor_init(&ta, MHA_F32, a, 3, (int64_t[]){2, 3, 4}));
    REQUIRE_OK(mha_tensor_init(&tb, MHA_F32, b, 1, (int64_t[]){5}));
    REQUIRE_OK(mha_tensor_init(&tm, MHA_BOOL, m, 2, (int64_t[]){2, 3}));
    REQUIRE_OK(mha_tensor_init(&ti, MHA_I64, ids, 1, (int64_t[]){3}));
    /* transposed view of a's first (3,4) slab: written in logical order */
    REQUIRE_OK(mha_tensor_init(&tbt, MHA_F32, a, 2, (int64_t[]){4, 3}));
    tbt.stride[0] = 1, tbt.stride[1] = 4;
    const char *names[] = {"layer.0.w", "b \"q\"", "mask", "ids", "wt"};
    const mha_tensor *ts[] = {&ta, &tb, &tm, &ti, &tbt};
    const char *keys[] = {"format", "k\n"}, *vals[] = {"pt", "v\\"};
    const char *tmp = "build-test-st.safetensors";
    REQUIRE_OK(mha_safetensors_write(tmp, names, ts, 5, keys, vals, 2));
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, tmp));
    CHECK(mha_safetensors_count(st) == 5);
    CHECK(!strcmp(mha_safetensors_name(st, 1), "b \"q\""));
    CHECK(!strcmp(mha_safetensors_metadata(st, "k\n"), "v\\"));
    mha_tensor t;
    REQUIRE_OK(mha_safetensors_get_f32(st, "layer.0.w", &t));
    CHECK(t.ndim == 3 && t.shape[2] == 4 && !memcmp(t.data, a, sizeof a));
    mha_tensor_free(&t);
    REQUIRE_OK(mha_safetensors_get_f32(st, "mask", &t));
    for (int i = 0; i < 6; i++)
        CHECK(((float *)t.data)[i] == (float)m[i]);
    mha_tensor_free(&t);
    REQUIRE_OK(mha_safetensors_get_f32(st, "ids", &t));
    CHECK(((float *)t.data)[0] == -5.0f && ((float *)t.data)[2] == 123456789.0f);
    mha_tensor_free(&t);
    REQUIRE_OK(mha_safetensors_get_f32(st, "wt", &t));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            CHECK(((float *)t.data)[i * 3 + j] == a[j * 4 + i]);
    mha_tensor_free(&t);
    mha_safetensors_free(st);

    /* duplicate names are refused by the writer */
    const char *dup[] = {"x", "x"};
    const mha_tensor *two[] = {&tb, &tb};
    CHECK_STATUS(mha_safetensors_write(tmp, dup, two, 2, NULL, NULL, 0), MHA_ERR_VALUE);
    /* an empty file (no tensors) is valid */
    REQUIRE_OK(mha_safetensors_write(tmp, NULL, NULL, 0, NULL, NULL, 0));
    REQUIRE_OK(mha_safetensors_open(&st, tmp));
    CHECK(mha_safetensors_count(st) == 0);
    mha_safetensors_free(st);
    remove(tmp);
}

/* Every read failing, short or at EOF: clean status, nothing leaked (ASan). */
TEST(safetensors_io_and_alloc_fault_injection) {
    const char *path = st_path("st_dtypes.safetensors");
    int64_t before = mha_test_io_count();
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, path));
    mha_safetensors_free(st);
    int64_t ops = mha_test_io_count() - before;
    for (int fault = 0; fault < 3; fault++)
        for (int64_t k = 1; k <= ops + 1; k++) {
            mha_test_fail_io(k, 1, (mha_io_fault)fault);
            mha_status s = mha_safetensors_open(&st, path);
            mha_tensor t = {0};
            if (s == MHA_OK)
                s = mha_safetensors_get_f32(st, "f64", &t); /* may read (mapping failed) */
            mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
            CHECK(s == MHA_OK || s == MHA_ERR_IO || s == MHA_ERR_FORMAT);
            if (fault == MHA_IO_FAULT_SHORT)
                CHECK(s == MHA_OK);
            if (s == MHA_OK) {
                CHECK(((float *)t.data)[14] == 1.75f);
                mha_tensor_free(&t);
            }
            mha_safetensors_free(s == MHA_OK || st ? st : NULL);
            st = NULL;
        }
    for (int64_t k = 1; k <= 40; k++) {
        mha_test_fail_alloc(k, 1);
        mha_status s = mha_safetensors_open(&st, path);
        mha_test_fail_alloc(0, 0);
        CHECK(s == MHA_OK || s == MHA_ERR_NOMEM);
        CHECK((s == MHA_OK) == (st != NULL));
        mha_safetensors_free(st);
    }
}
