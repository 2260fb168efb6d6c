/* test_io_branches.c - the branches of the file layer and the parsers that
 * malformed files (tests/corpus) cannot reach: accepted spellings, every
 * dtype conversion, API misuse (NULL arguments, bad dtypes), write failures
 * (full file size limit, missing directory), odd files (directory, empty
 * file, memory files).  Part of the branch coverage work (docs/coverage.md). */
#include "test.h"

#include "io/io.h"

#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------------- */

/* A .npy v1.0 in buf with the header text (padded like numpy) and data. */
static size_t npy_mem(uint8_t *buf, const char *header, const void *data, size_t n) {
    size_t h = strlen(header);
    size_t pad = 64 - (10 + h + 1) % 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    size_t hl = h + pad + 1;
    buf[8] = (uint8_t)(hl & 0xff);
    buf[9] = (uint8_t)(hl >> 8);
    memcpy(buf + 10, header, h);
    memset(buf + 10 + h, ' ', pad);
    buf[10 + h + pad] = '\n';
    memcpy(buf + 10 + hl, data, n);
    return 10 + hl + n;
}

static mha_status npy_mem_read(const char *header, const void *data, size_t n, mha_dtype want,
                               int keep_kind, int as_mask, mha_tensor *out) {
    static uint8_t buf[4096];
    size_t len = npy_mem(buf, header, data, n);
    mha_file f;
    mha_file_open_mem(&f, buf, len, "mem.npy");
    return mha_npy_read(&f, want, keep_kind, as_mask, out, NULL);
}

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/mha-iobr-%d-%s", (int)getpid(), name);
    return buf;
}

/* ---- file.c ------------------------------------------------------------------ */

TEST(io_branches_file_open_and_read_edges) {
    mha_file f;
    CHECK_STATUS(mha_file_open(NULL, "x"), MHA_ERR_NULL);
    CHECK_STATUS(mha_file_open(&f, NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_file_open(&f, "/tmp"), MHA_ERR_IO);
    CHECK(strstr(mha_last_error(), "not a regular file") != NULL);

    static const uint8_t mem[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    mha_file_open_mem(&f, mem, sizeof mem, NULL);
    CHECK(!strcmp(f.name, "<memory>"));
    uint8_t b[8];
    CHECK_STATUS(mha_file_read(&f, 2, b, 4, "x"), MHA_OK);
    CHECK(b[0] == 3 && b[3] == 6);
    CHECK_STATUS(mha_file_read(&f, -1, b, 1, "x"), MHA_ERR_FORMAT);
    CHECK_STATUS(mha_file_read(&f, INT64_MAX, b, 2, "x"), MHA_ERR_FORMAT);
    CHECK_STATUS(mha_file_read(&f, 0, b, SIZE_MAX, "x"), MHA_ERR_FORMAT);
    const uint8_t *map = NULL;
    CHECK_STATUS(mha_file_map(&f, &map), MHA_OK);
    CHECK(map == mem);
    mha_file_unmap(&f, map); /* a memory file: nothing to unmap */
    mha_file_close(&f);
    mha_file_close(NULL);

    /* an empty regular file does not map; a mapping the kernel refuses
     * leaves *map NULL (the callers then read) */
    const char *p = tmp_path("empty");
    FILE *fp = fopen(p, "wb");
    REQUIRE(fp != NULL);
    fclose(fp);
    REQUIRE_OK(mha_file_open(&f, p));
    CHECK_STATUS(mha_file_map(&f, &map), MHA_OK);
    CHECK(map == NULL);
    f.size = INT64_C(1) << 60; /* far more than the address space */
    CHECK_STATUS(mha_file_map(&f, &map), MHA_OK);
    CHECK(map == NULL);
    mha_file_close(&f);
    remove(p);
}

TEST(io_branches_file_write_failures) {
    mha_wfile w;
    CHECK_STATUS(mha_wfile_create(NULL, "x"), MHA_ERR_NULL);
    CHECK_STATUS(mha_wfile_create(&w, NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_wfile_create(&w, "/nonexistent-dir/x"), MHA_ERR_IO);

    /* zero-byte writes, not keeping the file, finishing twice */
    const char *p = tmp_path("w");
    REQUIRE_OK(mha_wfile_create(&w, p));
    CHECK_STATUS(mha_wfile_write(&w, "", 0), MHA_OK);
    CHECK_STATUS(mha_wfile_write(&w, "abc", 3), MHA_OK);
    CHECK_STATUS(mha_wfile_finish(&w, 0), MHA_OK);
    CHECK(access(p, F_OK) != 0);
    CHECK_STATUS(mha_wfile_finish(&w, 1), MHA_OK);

    /* an injected write failure sticks: later writes fail at once */
    REQUIRE_OK(mha_wfile_create(&w, p));
    mha_test_fail_io(1, 0, MHA_IO_FAULT_FAIL);
    CHECK_STATUS(mha_wfile_write(&w, "abc", 3), MHA_ERR_IO);
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
    CHECK_STATUS(mha_wfile_write(&w, "abc", 3), MHA_ERR_IO);
    CHECK_STATUS(mha_wfile_finish(&w, 1), MHA_ERR_IO);
    CHECK(access(p, F_OK) != 0);

    /* real write errors: a file size limit (EFBIG) makes a write fail at
     * once (the writer does not buffer: each mha_wfile_write is a write(2)) */
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 16;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    static char big[1 << 16];
    REQUIRE_OK(mha_wfile_create(&w, p));
    CHECK_STATUS(mha_wfile_write(&w, big, sizeof big), MHA_ERR_IO);
    CHECK_STATUS(mha_wfile_finish(&w, 1), MHA_ERR_IO);
    REQUIRE_OK(mha_wfile_create(&w, p));
    CHECK_STATUS(mha_wfile_write(&w, big, 8), MHA_OK);
    CHECK_STATUS(mha_wfile_write(&w, big, 64), MHA_ERR_IO);
    CHECK(strstr(mha_last_error(), "File too large") != NULL);
    CHECK_STATUS(mha_wfile_finish(&w, 1), MHA_ERR_IO);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, oldsig);
    CHECK(access(p, F_OK) != 0);
}

TEST(io_branches_half_subnormal_ties) {
    /* subnormal halves: ties round to even */
    CHECK(mha_float_to_half(1.5f * 0x1p-24f) == 2);
    CHECK(mha_float_to_half(2.5f * 0x1p-24f) == 2);
    CHECK(mha_float_to_half(2.75f * 0x1p-24f) == 3);
    CHECK(mha_float_to_half(2.25f * 0x1p-24f) == 2);
}

/* ---- npy.c -------------------------------------------------------------------- */

TEST(io_branches_npy_accepted_spellings) {
    float d[6] = {0, 1, 2, 3, 4, 5};
    mha_tensor t;
    /* double quotes, Python 2 longs, no spaces */
    CHECK_STATUS(npy_mem_read("{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2L,3L)}", d,
                              24, MHA_F32, 0, 0, &t),
                 MHA_OK);
    CHECK(t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3 && ((float *)t.data)[5] == 5);
    mha_tensor_free(&t);
    /* Fortran order of one dimension and of zero elements: nothing to move */
    CHECK_STATUS(npy_mem_read("{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", d, 24,
                              MHA_F32, 0, 0, &t),
                 MHA_OK);
    CHECK(t.ndim == 1 && ((float *)t.data)[4] == 4);
    mha_tensor_free(&t);
    CHECK_STATUS(npy_mem_read("{'descr': '<f4', 'fortran_order': True, 'shape': (0, 3), }", d, 0,
                              MHA_F32, 0, 0, &t),
                 MHA_OK);
    CHECK(t.ndim == 2 && t.shape[0] == 0);
    mha_tensor_free(&t);
    /* scalar */
    CHECK_STATUS(npy_mem_read("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", d, 4,
                              MHA_F32, 0, 0, &t),
                 MHA_OK);
    CHECK(t.ndim == 0);
    mha_tensor_free(&t);
}

TEST(io_branches_npy_every_dtype_to_every_kind) {
    static const struct {
        const char *descr;
        uint8_t bytes[16]; /* two elements: 1 and -2 (or 0 for unsigned/bool) */
        size_t n;
        float f[2];
        int64_t i[2];
    } c[] = {
        {"<f2", {0x00, 0x3c, 0x00, 0xc0}, 4, {1, -2}, {0, 0}},
        {"<f4", {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}, 8, {1, -2}, {0, 0}},
        {"<f8", {0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0xc0}, 16, {1, -2}, {0, 0}},
        {"|b1", {1, 0}, 2, {1, 0}, {1, 0}},
        {"|u1", {1, 254}, 2, {1, 254}, {1, 254}},
        {"|i1", {1, 0xfe}, 2, {1, -2}, {1, -2}},
        {"<i4", {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}, 8, {1, -2}, {1, -2}},
        {"<i8", {1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 16,
         {1, -2}, {1, -2}},
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        char hdr[128];
        snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }",
                 c[k].descr);
        int is_float = c[k].descr[1] == 'f';
        mha_tensor t;
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_F32, 0, 0, &t), MHA_OK);
        CHECK(((float *)t.data)[0] == c[k].f[0] && ((float *)t.data)[1] == c[k].f[1]);
        mha_tensor_free(&t);
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_F16, 0, 0, &t), MHA_OK);
        CHECK(mha_half_to_float(((uint16_t *)t.data)[0]) == c[k].f[0] &&
              mha_half_to_float(((uint16_t *)t.data)[1]) == c[k].f[1]);
        mha_tensor_free(&t);
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_BOOL, 0, 0, &t), MHA_OK);
        CHECK(((uint8_t *)t.data)[0] == 1 && ((uint8_t *)t.data)[1] == (c[k].f[1] != 0));
        mha_tensor_free(&t);
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_I64, 0, 0, &t),
                     is_float ? MHA_ERR_DTYPE : MHA_OK);
        if (!is_float)
            CHECK(((int64_t *)t.data)[0] == c[k].i[0] && ((int64_t *)t.data)[1] == c[k].i[1]);
        mha_tensor_free(&t);
        /* keep the kind, as a mask */
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_F32, 1, 1, &t), MHA_OK);
        CHECK(t.dtype == (is_float ? MHA_F32 : MHA_BOOL));
        mha_tensor_free(&t);
        CHECK_STATUS(npy_mem_read(hdr, c[k].bytes, c[k].n, MHA_F32, 1, 0, &t), MHA_OK);
        CHECK(t.dtype == (is_float ? MHA_F32 : c[k].descr[1] == 'b' ? MHA_BOOL : MHA_I64));
        mha_tensor_free(&t);
    }
    mha_tensor t;
    CHECK_STATUS(npy_mem_read("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                              "\0\0\0\0", 4, (mha_dtype)99, 0, 0, &t),
                 MHA_ERR_DTYPE);
    mha_file f;
    mha_file_open_mem(&f, (const uint8_t *)"", 0, NULL);
    CHECK_STATUS(mha_npy_read(&f, MHA_F32, 0, 0, NULL, NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_npy_load(NULL, "x.npy", MHA_F32), MHA_ERR_NULL);
}

TEST(io_branches_npy_save_api) {
    const char *p = tmp_path("s.npy");
    float x[4] = {1, 2, 3, 4};
    mha_tensor t;
    REQUIRE_OK(mha_tensor_init(&t, MHA_F32, x, 2, (int64_t[]){2, 2}));
    CHECK_STATUS(mha_npy_save(&t, NULL, MHA_F32), MHA_ERR_NULL);
    mha_tensor bad = t;
    bad.ndim = -1;
    CHECK_STATUS(mha_npy_save(&bad, p, MHA_F32), MHA_ERR_SHAPE);
    bad.ndim = MHA_MAX_DIMS + 1;
    CHECK_STATUS(mha_npy_save(&bad, p, MHA_F32), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_npy_save(&t, p, MHA_BOOL), MHA_ERR_DTYPE);
    int64_t iv[2] = {1, 2};
    mha_tensor ti;
    REQUIRE_OK(mha_tensor_init(&ti, MHA_I64, iv, 1, (int64_t[]){2}));
    CHECK_STATUS(mha_npy_save(&ti, p, MHA_I64), MHA_ERR_DTYPE);
    CHECK_STATUS(mha_npy_save(&ti, p, MHA_F32), MHA_ERR_DTYPE);
    bad = t;
    bad.shape[0] = -1;
    CHECK(mha_npy_save(&bad, p, MHA_F32) != MHA_OK);
    bad = t;
    bad.data = NULL;
    CHECK_STATUS(mha_npy_save(&bad, p, MHA_F32), MHA_ERR_NULL);
    CHECK_STATUS(mha_npy_save(NULL, p, MHA_F32), MHA_ERR_NULL);
    CHECK_STATUS(mha_npy_save(&t, p, MHA_F16), MHA_OK);
    uint8_t bv[2] = {0, 3};
    mha_tensor tbool;
    REQUIRE_OK(mha_tensor_init(&tbool, MHA_BOOL, bv, 1, (int64_t[]){2}));
    CHECK_STATUS(mha_npy_save(&tbool, p, MHA_BOOL), MHA_OK);
    bad = t;
    bad.stride[0] = -100; /* reaches before the data */
    CHECK(mha_npy_save(&bad, p, MHA_F32) != MHA_OK);
    CHECK_STATUS(mha_npy_save(&t, "/nonexistent-dir/x.npy", MHA_F32), MHA_ERR_IO);

    /* F16 tensor as F16, and more data than one write buffer */
    uint16_t h[3] = {0x3c00, 0x4000, 0x4200};
    mha_tensor th;
    REQUIRE_OK(mha_tensor_init(&th, MHA_F16, h, 1, (int64_t[]){3}));
    REQUIRE_OK(mha_npy_save(&th, p, MHA_F16));
    mha_tensor back;
    REQUIRE_OK(mha_npy_load(&back, p, MHA_F32));
    CHECK(((float *)back.data)[2] == 3.0f);
    mha_tensor_free(&back);
    static float big[5000];
    for (int i = 0; i < 5000; i++)
        big[i] = (float)i;
    mha_tensor tb;
    REQUIRE_OK(mha_tensor_init(&tb, MHA_F32, big, 1, (int64_t[]){5000}));
    REQUIRE_OK(mha_npy_save(&tb, p, MHA_F32));
    REQUIRE_OK(mha_npy_load(&back, p, MHA_F32));
    CHECK(back.shape[0] == 5000 && ((float *)back.data)[4999] == 4999.0f);
    mha_tensor_free(&back);
    remove(p);
}

/* ---- safetensors.c ------------------------------------------------------------ */

/* Opens the safetensors bytes (8-byte length + header + data) from memory. */
static mha_status st_mem(const char *header, const void *data, size_t n, mha_safetensors **st) {
    static uint8_t buf[8192];
    size_t h = strlen(header);
    for (int k = 0; k < 8; k++)
        buf[k] = (uint8_t)((uint64_t)h >> (8 * k));
    memcpy(buf + 8, header, h);
    memcpy(buf + 8 + h, data, n);
    mha_file f;
    mha_file_open_mem(&f, buf, 8 + h + n, "mem.safetensors");
    return mha_safetensors_read(&f, st);
}

TEST(io_branches_safetensors_names_escapes_and_integer_dtypes) {
    /* escaped and raw UTF-8 names of 1 to 4 bytes, every integer dtype */
    static const char hdr[] =
        "{\"__metadata__\":{\"k\":\"v\",\"\\u00E9\":\"\\u00e9\",\"p\":\"\\ue000\"},"
        "\"\\u00e9\\u20ac\\ud83d\\ude00\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]},"
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80x\":{\"dtype\":\"U8\",\"shape\":[2],"
        "\"data_offsets\":[2,4]},"
        "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]},"
        "\"u16\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[8,12]},"
        "\"i32\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[12,20]},"
        "\"u32\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[20,28]},"
        "\"i64\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[28,44]},"
        "\"u64\":{\"dtype\":\"U64\",\"shape\":[2],\"data_offsets\":[44,60]},"
        "\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[60,64]},"
        "\"d5\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[64,68]},"
        "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[68,72]}}";
    uint8_t d[72] = {0};
    d[0] = 1, d[1] = 0xfe;                               /* I8 1 -2 */
    d[2] = 1, d[3] = 254;                                /* U8 */
    d[4] = 1, d[6] = 0xfe, d[7] = 0xff;                  /* I16 */
    d[8] = 1, d[10] = 0xfe, d[11] = 0xff;                /* U16 1 65534 */
    d[12] = 1, memset(d + 16, 0xff, 4), d[16] = 0xfe;    /* I32 */
    d[20] = 1, d[24] = 2;                                /* U32 1 2 */
    d[28] = 1, memset(d + 36, 0xff, 8), d[36] = 0xfe;    /* I64 */
    d[44] = 1, d[52] = 2;                                /* U64 */
    d[66] = 0x80, d[67] = 0x3f, d[70] = 0x80, d[71] = 0x3f; /* 1.0f twice */
    mha_safetensors *st;
    REQUIRE_OK(st_mem(hdr, d, sizeof d, &st));
    CHECK(mha_safetensors_count(st) == 11);
    CHECK(!strcmp(mha_safetensors_name(st, 0), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
    CHECK(mha_safetensors_name(st, -1) == NULL && mha_safetensors_name(st, 11) == NULL);
    CHECK(mha_safetensors_name(NULL, 0) == NULL && mha_safetensors_count(NULL) == 0);
    CHECK(mha_safetensors_find(NULL, "x") == -1 && mha_safetensors_find(st, NULL) == -1);
    CHECK(mha_safetensors_metadata_count(st) == 3 && mha_safetensors_metadata_count(NULL) == 0);
    CHECK(!strcmp(mha_safetensors_metadata_key(st, 1), "\xc3\xa9"));
    CHECK(!strcmp(mha_safetensors_metadata_value(st, 1), "\xc3\xa9"));
    CHECK(mha_safetensors_metadata_key(st, 3) == NULL);
    CHECK(mha_safetensors_metadata_key(st, -1) == NULL);
    CHECK(mha_safetensors_metadata_key(NULL, 0) == NULL);
    CHECK(mha_safetensors_metadata_value(st, 3) == NULL);
    CHECK(!strcmp(mha_safetensors_metadata_value(st, 2), "\xee\x80\x80"));
    CHECK(mha_safetensors_metadata_value(st, -1) == NULL);
    CHECK(mha_safetensors_metadata_value(NULL, 0) == NULL);
    CHECK(!strcmp(mha_safetensors_metadata(st, "k"), "v"));
    CHECK(mha_safetensors_metadata(st, "zz") == NULL && mha_safetensors_metadata(st, NULL) == NULL);
    CHECK(mha_safetensors_metadata(NULL, "k") == NULL);

    static const struct {
        const char *name;
        float a, b;
    } want[] = {{"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 1, -2},
                {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80x", 1, 254},
                {"i16", 1, -2}, {"u16", 1, 65534}, {"i32", 1, -2}, {"u32", 1, 2},
                {"i64", 1, -2}, {"u64", 1, 2}};
    for (int i = 0; i < 8; i++) {
        mha_tensor t;
        REQUIRE_OK(mha_safetensors_get_f32(st, want[i].name, &t));
        float *x = t.data;
        CHECK(x[0] == want[i].a && x[1] == want[i].b);
        mha_tensor_free(&t);
    }
    mha_tensor t;
    CHECK_STATUS(mha_safetensors_get_f32(st, "f8", &t), MHA_ERR_UNSUPPORTED);
    CHECK_STATUS(mha_safetensors_get_f32(st, "d5", &t), MHA_ERR_UNSUPPORTED);
    CHECK_STATUS(mha_safetensors_get_f32(st, "nope", &t), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_get_f32(st, NULL, &t), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_get_f32(NULL, "s", &t), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_get_f32(st, "s", NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_view_f32(st, "s", NULL), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_view_f32(st, "nope", &t), MHA_ERR_VALUE);
    REQUIRE_OK(mha_safetensors_get_f32(st, "s", &t));
    CHECK(t.ndim == 0 && ((float *)t.data)[0] == 1.0f);
    mha_tensor_free(&t);
    const char *dt;
    int nd;
    int64_t shape[MHA_SAFETENSORS_MAX_DIMS];
    CHECK_STATUS(mha_safetensors_info(NULL, 0, &dt, &nd, shape), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_info(st, -1, &dt, &nd, shape), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_info(st, 11, &dt, &nd, shape), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_info(st, 10, NULL, NULL, NULL), MHA_OK);
    mha_safetensors_free(st);
    mha_safetensors_free(NULL);
    CHECK_STATUS(mha_safetensors_open(NULL, "x"), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_open(&st, "/nonexistent-dir/x"), MHA_ERR_IO);
    CHECK(st == NULL);

    /* read without a mapping: every read path, then a failing data read */
    mha_test_fail_io(2, 0, MHA_IO_FAULT_FAIL); /* the 2nd I/O operation is the map */
    REQUIRE_OK(st_mem(hdr, d, sizeof d, &st));
    REQUIRE_OK(mha_safetensors_get_f32(st, "i16", &t));
    CHECK(((float *)t.data)[1] == -2.0f);
    mha_tensor_free(&t);
    mha_test_fail_io(1, 0, MHA_IO_FAULT_FAIL);
    CHECK_STATUS(mha_safetensors_get_f32(st, "i16", &t), MHA_ERR_IO);
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
    mha_safetensors_free(st);
    /* no mapping, and the header buffer cannot be allocated */
    mha_test_fail_io(2, 0, MHA_IO_FAULT_FAIL);
    mha_test_fail_alloc(3, 0); /* st, the string scratch, the header copy */
    CHECK_STATUS(st_mem(hdr, d, sizeof d, &st), MHA_ERR_NOMEM);
    mha_test_fail_alloc(0, 0);
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
}

TEST(io_branches_safetensors_write_api) {
    const char *p = tmp_path("w.safetensors");
    float x[2] = {1, 2};
    mha_tensor t;
    REQUIRE_OK(mha_tensor_init(&t, MHA_F32, x, 1, (int64_t[]){2}));
    const mha_tensor *ts[3] = {&t, &t, &t};
    const char *nm[3] = {"a", "b", "c"};
    const char *mk[1] = {"k"}, *mv[1] = {"v"}, *nul[1] = {NULL};
    CHECK_STATUS(mha_safetensors_write(NULL, nm, ts, 1, NULL, NULL, 0), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, NULL, ts, 1, NULL, NULL, 0), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, nm, NULL, 1, NULL, NULL, 0), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, NULL, NULL, 0, NULL, NULL, 0), MHA_OK);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, NULL, mv, 1), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, mk, NULL, 1), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, -1, NULL, NULL, 0), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, mk, mv, -1), MHA_ERR_VALUE);
    const char *nn[2] = {NULL, "b"};
    CHECK_STATUS(mha_safetensors_write(p, nn, ts, 2, NULL, NULL, 0), MHA_ERR_NULL);
    const char *nul2[2] = {NULL, "k"};
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, nul2, nul2, 2), MHA_ERR_NULL);
    const mha_tensor *tn[1] = {NULL};
    CHECK_STATUS(mha_safetensors_write(p, nm, tn, 1, NULL, NULL, 0), MHA_ERR_NULL);
    const char *empty[1] = {""}, *md[1] = {"__metadata__"};
    CHECK_STATUS(mha_safetensors_write(p, empty, ts, 1, NULL, NULL, 0), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_write(p, md, ts, 1, NULL, NULL, 0), MHA_ERR_VALUE);
    mha_tensor bad = t;
    const mha_tensor *tb[1] = {&bad};
    bad.dtype = (mha_dtype)99;
    CHECK_STATUS(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0), MHA_ERR_DTYPE);
    bad = t, bad.ndim = -1;
    CHECK_STATUS(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0), MHA_ERR_SHAPE);
    bad = t, bad.ndim = MHA_MAX_DIMS + 1;
    CHECK_STATUS(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0), MHA_ERR_SHAPE);
    bad = t, bad.shape[0] = -1;
    CHECK(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0) != MHA_OK);
    bad = t, bad.data = NULL;
    CHECK_STATUS(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0), MHA_ERR_NULL);
    bad = t, bad.shape[0] = 0, bad.data = NULL; /* empty: no data needed */
    CHECK_STATUS(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0), MHA_OK);
    bad = t, bad.stride[0] = -100;
    CHECK(mha_safetensors_write(p, nm, tb, 1, NULL, NULL, 0) != MHA_OK);
    const char *dup[3] = {"a", "b", "a"};
    CHECK_STATUS(mha_safetensors_write(p, dup, ts, 3, NULL, NULL, 0), MHA_ERR_VALUE);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, nul, mv, 1), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write(p, nm, ts, 1, mk, nul, 1), MHA_ERR_NULL);
    CHECK_STATUS(mha_safetensors_write("/nonexistent-dir/x", nm, ts, 1, NULL, NULL, 0),
                 MHA_ERR_IO);
    /* several tensors without metadata, a bool tensor, a large tensor */
    uint8_t bv[2] = {0, 7};
    mha_tensor tbool;
    REQUIRE_OK(mha_tensor_init(&tbool, MHA_BOOL, bv, 1, (int64_t[]){2}));
    static float big[5000];
    mha_tensor tbig;
    REQUIRE_OK(mha_tensor_init(&tbig, MHA_F32, big, 1, (int64_t[]){5000}));
    uint16_t hv[2] = {0x3c00, 0x4000};
    mha_tensor th;
    REQUIRE_OK(mha_tensor_init(&th, MHA_F16, hv, 1, (int64_t[]){2}));
    const mha_tensor *tm[3] = {&th, &tbool, &tbig};
    REQUIRE_OK(mha_safetensors_write(p, nm, tm, 3, NULL, NULL, 0));
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, p));
    CHECK(mha_safetensors_count(st) == 3);
    mha_safetensors_free(st);
    /* unmapped: a large tensor is read in several chunks; a failing chunk */
    mha_test_fail_io(2, 0, MHA_IO_FAULT_FAIL); /* read of the length, then the map */
    REQUIRE_OK(mha_safetensors_open(&st, p));
    mha_tensor got;
    REQUIRE_OK(mha_safetensors_get_f32(st, "c", &got));
    CHECK(got.shape[0] == 5000);
    mha_tensor_free(&got);
    mha_test_fail_io(2, 0, MHA_IO_FAULT_FAIL);
    CHECK_STATUS(mha_safetensors_get_f32(st, "c", &got), MHA_ERR_IO);
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
    mha_safetensors_free(st);
    /* a header write failure, and a data write failure */
    for (int k = 1; k <= 3; k++) {
        mha_test_fail_io(k, 0, MHA_IO_FAULT_FAIL);
        CHECK_STATUS(mha_safetensors_write(p, nm, tm, 3, mk, mv, 1), MHA_ERR_IO);
    }
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
    remove(p);
}
