/* test_io_branches.c - the branches of the file layer and the parsers that
 * malformed files (tests/corpus) cannot reach: accepted spellings, every
 * dtype conversion, API misuse (NULL arguments, bad dtypes), write failures
 * (full file size limit, missing directory), odd files (directory, empty
 * file, memory files).  Part of the branch coverage work (docs/coverage.md). */
#include "test.h"

#include "../../src/io/io.h"

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

    /* real write errors: a file size limit (EFBIG) makes a large fwrite
     * fail at once and a small buffered one fail at fclose */
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
    CHECK_STATUS(mha_wfile_write(&w, big, 64), MHA_OK);
    CHECK_STATUS(mha_wfile_finish(&w, 1), MHA_ERR_IO);
    CHECK(strstr(mha_last_error(), "on close") != NULL);
    REQUIRE_OK(mha_wfile_create(&w, p)); /* a failed write, then a failing close */
    CHECK_STATUS(mha_wfile_write(&w, big, 64), MHA_OK);
    mha_test_fail_io(1, 0, MHA_IO_FAULT_FAIL);
    CHECK_STATUS(mha_wfile_write(&w, big, 8), MHA_ERR_IO);
    mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
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
    CHECK_STATUS(mha_npy_load("x.npy", MHA_F32, NULL), MHA_ERR_NULL);
}

TEST(io_branches_npy_save_api) {
    const char *p = tmp_path("s.npy");
    float x[4] = {1, 2, 3, 4};
    mha_tensor t;
    REQUIRE_OK(mha_tensor_init(&t, MHA_F32, x, 2, (int64_t[]){2, 2}));
    CHECK_STATUS(mha_npy_save(NULL, &t, MHA_F32), MHA_ERR_NULL);
    mha_tensor bad = t;
    bad.ndim = -1;
    CHECK_STATUS(mha_npy_save(p, &bad, MHA_F32), MHA_ERR_SHAPE);
    bad.ndim = MHA_MAX_DIMS + 1;
    CHECK_STATUS(mha_npy_save(p, &bad, MHA_F32), MHA_ERR_SHAPE);
    CHECK_STATUS(mha_npy_save(p, &t, MHA_BOOL), MHA_ERR_DTYPE);
    int64_t iv[2] = {1, 2};
    mha_tensor ti;
    REQUIRE_OK(mha_tensor_init(&ti, MHA_I64, iv, 1, (int64_t[]){2}));
    CHECK_STATUS(mha_npy_save(p, &ti, MHA_I64), MHA_ERR_DTYPE);
    CHECK_STATUS(mha_npy_save(p, &ti, MHA_F32), MHA_ERR_DTYPE);
    bad = t;
    bad.shape[0] = -1;
    CHECK(mha_npy_save(p, &bad, MHA_F32) != MHA_OK);
    bad = t;
    bad.data = NULL;
    CHECK_STATUS(mha_npy_save(p, &bad, MHA_F32), MHA_ERR_NULL);
    CHECK_STATUS(mha_npy_save(p, NULL, MHA_F32), MHA_ERR_NULL);
    CHECK_STATUS(mha_npy_save(p, &t, MHA_F16), MHA_OK);
    uint8_t bv[2] = {0, 3};
    mha_tensor tbool;
    REQUIRE_OK(mha_tensor_init(&tbool, MHA_BOOL, bv, 1, (int64_t[]){2}));
    CHECK_STATUS(mha_npy_save(p, &tbool, MHA_BOOL), MHA_OK);
    bad = t;
    bad.stride[0] = -100; /* reaches before the data */
    CHECK(mha_npy_save(p, &bad, MHA_F32) != MHA_OK);
    CHECK_STATUS(mha_npy_save("/nonexistent-dir/x.npy", &t, MHA_F32), MHA_ERR_IO);

    /* F16 tensor as F16, and more data than one write buffer */
    uint16_t h[3] = {0x3c00, 0x4000, 0x4200};
    mha_tensor th;
    REQUIRE_OK(mha_tensor_init(&th, MHA_F16, h, 1, (int64_t[]){3}));
    REQUIRE_OK(mha_npy_save(p, &th, MHA_F16));
    mha_tensor back;
    REQUIRE_OK(mha_npy_load(p, MHA_F32, &back));
    CHECK(((float *)back.data)[2] == 3.0f);
    mha_tensor_free(&back);
    static float big[5000];
    for (int i = 0; i < 5000; i++)
        big[i] = (float)i;
    mha_tensor tb;
    REQUIRE_OK(mha_tensor_init(&tb, MHA_F32, big, 1, (int64_t[]){5000}));
    REQUIRE_OK(mha_npy_save(p, &tb, MHA_F32));
    REQUIRE_OK(mha_npy_load(p, MHA_F32, &back));
    CHECK(back.shape[0] == 5000 && ((float *)back.data)[4999] == 4999.0f);
    mha_tensor_free(&back);
    remove(p);
}
