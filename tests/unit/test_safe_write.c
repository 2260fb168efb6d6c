/* test_safe_write.c - the safe writer (src/io/file.c) and checkpoints as one
 * unit (src/model.c), the guards of issue 12's defects 1, 2 and 5.
 *
 *   * a failure injected (ENOSPC, EIO) at every step of every writer -
 *     creating the temporary, each write, flush, fsync, rename, directory
 *     fsync - leaves the previous file byte-identical and no temporary
 *     behind (a failed directory fsync: the complete new file); each loop
 *     asserts it hit its injection points;
 *   * a child SIGKILLed at random points while rewriting a file (300
 *     trials) never leaves a target that fails to load: old or new, whole;
 *   * a reader holding the old file mapped keeps reading the old bytes (no
 *     SIGBUS) while the path is rewritten;
 *   * a FIFO target is written directly and never removed, even after a
 *     failed write (this replaces the old render test that wrote to a device);
 *   * checkpoints: a model beside an optimiser of another step or run is
 *     refused naming both; a metadata-only checkpoint promising a huge model
 *     is refused before the model is allocated.
 * Everything happens inside one mkdtemp directory per test.
 */
#include "test.h"

#include "../../src/io/io.h"
#include "render.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------ */

static void make_dir(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/mha-safe-XXXXXX");
    if (!mkdtemp(dir))
        dir[0] = '\0';
}

/* Removes dir and the plain files in it. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Files in dir whose names contain ".mha-tmp" (the writer's temporaries). */
static int count_temporaries(const char *dir, int remove_them) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    char p[512];
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".mha-tmp")) {
            n++;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (remove_them)
                unlink(p);
        }
    if (d)
        closedir(d);
    return n;
}

/* The whole file (malloc'd, *n bytes), or NULL when it cannot be read. */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)size + 1);
    if (b && fread(b, 1, (size_t)size, f) != (size_t)size) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)size;
    return b;
}

static int same_bytes(const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
    return a && b && na == nb && memcmp(a, b, na) == 0;
}

/* ---- the writers under test: each writes version v (0 old, 1 new) of path ---------- */

typedef mha_status (*writer_fn)(const char *path, int v);

static mha_status write_npy(const char *path, int v) {
    float x[300];
    for (int i = 0; i < 300; i++)
        x[i] = (float)(i * (v + 1));
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 2, (int64_t[]){v ? 15 : 20, v ? 20 : 15});
    return mha_npy_save(&t, path, MHA_F32);
}

static mha_status write_safetensors(const char *path, int v) {
    static float x[5000]; /* more than one 8 KB write */
    for (int i = 0; i < 5000; i++)
        x[i] = (float)(i + v);
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 1, (int64_t[]){v ? 5000 : 4000});
    const char *names[] = {"x"};
    const mha_tensor *ts[] = {&t};
    const char *k[] = {"version"}, *val[] = {v ? "new" : "old"};
    return mha_safetensors_write(path, names, ts, 1, k, val, 1);
}

static mha_status write_stream(const char *path, int v) {
    mha_safe_file *f;
    mha_status st = mha_safe_file_open(&f, path);
    if (st != MHA_OK)
        return st;
    for (int i = 0; i < 3000; i++) /* more than one stdio buffer */
        fprintf(mha_safe_file_stream(f), "%s line %d\n", v ? "new" : "old", i);
    return mha_safe_file_close(f, 1);
}

static mha_status render_status_to_mha(render_status r) {
    return r == RENDER_OK ? MHA_OK : MHA_ERR_IO;
}

static mha_status write_svg(const char *path, int v) {
    float w[6] = {1, 0, 0.5f, 0.5f, 0, (float)v};
    render_maps m = {1, 2, 3, w, NULL, NULL, v ? "new" : "old", 0};
    char err[256] = "";
    render_status r = render_svg_write(&m, path, err, sizeof err);
    if (r != RENDER_OK && !strstr(err, path))
        test_fail(__FILE__, __LINE__, "svg error '%s' lacks the path", err);
    return render_status_to_mha(r);
}

#ifdef MHA_HAVE_PNG
static mha_status write_png(const char *path, int v) {
    float w[6] = {1, 0, 0.5f, 0.5f, 0, (float)v};
    render_maps m = {1, 2, 3, w, NULL, NULL, v ? "new" : "old", 0};
    char err[256] = "";
    render_status r = render_png_write(&m, path, err, sizeof err);
    if (r != RENDER_OK && !strstr(err, path))
        test_fail(__FILE__, __LINE__, "png error '%s' lacks the path", err);
    return render_status_to_mha(r);
}
#endif

/* The injection loop over one writer: the old file on disk, fault f at the
 * k-th step (once), k = 1, 2, ... until the write completes untouched. */
static void injection_loop(const char *name, writer_fn write) {
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(path, sizeof path, "%s/out", dir);
    size_t n_new, n_old;
    REQUIRE(write(path, 1) == MHA_OK);
    uint8_t *fresh = slurp(path, &n_new);
    REQUIRE(write(path, 0) == MHA_OK);
    uint8_t *old = slurp(path, &n_old);
    REQUIRE(fresh && old && !same_bytes(fresh, n_new, old, n_old));
    static const mha_io_fault faults[] = {MHA_IO_FAULT_NOSPACE, MHA_IO_FAULT_FAIL};
    for (int f = 0; f < 2; f++) {
        int64_t points = 0, dir_sync_points = 0;
        REQUIRE(write(path, 0) == MHA_OK);
        for (int64_t k = 1; k < 1000; k++) {
            int64_t before = mha_test_io_count();
            mha_test_fail_io(k, 0, faults[f]);
            mha_status st = write(path, 1);
            mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
            int64_t ops = mha_test_io_count() - before;
            size_t n;
            uint8_t *now = slurp(path, &n);
            if (ops < k) { /* ran to completion without meeting the fault */
                CHECK(st == MHA_OK);
                CHECK(same_bytes(now, n, fresh, n_new));
                free(now);
                break;
            }
            points++;
            if (st == MHA_OK)
                test_fail(__FILE__, __LINE__, "%s: fault at step %lld ignored", name, (long long)k);
            int dir_sync = strstr(mha_last_error(), "syncing its directory") != NULL;
            dir_sync_points += dir_sync;
            if (!same_bytes(now, n, dir_sync ? fresh : old, dir_sync ? n_new : n_old))
                test_fail(__FILE__, __LINE__, "%s: fault at step %lld (%s): the target changed",
                          name, (long long)k, mha_last_error());
            if (f == 0 && !dir_sync && !strstr(mha_last_error(), "No space"))
                test_fail(__FILE__, __LINE__, "%s: ENOSPC at step %lld: message '%s'", name,
                          (long long)k, mha_last_error());
            free(now);
            if (count_temporaries(dir, 1) != 0)
                test_fail(__FILE__, __LINE__, "%s: step %lld left a temporary", name,
                          (long long)k);
            if (dir_sync) /* the new file is in place: put the old one back */
                REQUIRE(write(path, 0) == MHA_OK);
        }
        /* create, >= 1 write, fsync, rename, directory fsync at least */
        if (points < 5 || dir_sync_points != 1)
            test_fail(__FILE__, __LINE__, "%s: %lld injection points, %lld at the directory fsync",
                      name, (long long)points, (long long)dir_sync_points);
        printf("ok %s: %lld write-path injection points\n", name, (long long)points);
    }
    free(fresh), free(old);
    remove_dir(dir);
}

TEST(safe_write_faults_keep_the_old_npy) { injection_loop("mha_npy_save", write_npy); }
TEST(safe_write_faults_keep_the_old_safetensors) {
    injection_loop("mha_safetensors_write", write_safetensors);
}
TEST(safe_write_faults_keep_the_old_stream_file) {
    injection_loop("mha_safe_file", write_stream);
}
TEST(safe_write_faults_keep_the_old_svg) { injection_loop("render_svg_write", write_svg); }
#ifdef MHA_HAVE_PNG
TEST(safe_write_faults_keep_the_old_png) { injection_loop("render_png_write", write_png); }
#endif

TEST(safe_write_keeps_mode_and_writes_through_symlinks) {
    char dir[64], path[128], link[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(path, sizeof path, "%s/file", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    REQUIRE_OK(write_npy(path, 0));
    REQUIRE(chmod(path, 0640) == 0);
    REQUIRE(symlink("file", link) == 0);
    REQUIRE_OK(write_npy(link, 1)); /* through the link: the file is replaced */
    struct stat sb;
    REQUIRE(lstat(link, &sb) == 0);
    CHECK(S_ISLNK(sb.st_mode));
    REQUIRE(stat(path, &sb) == 0);
    CHECK((sb.st_mode & 07777) == 0640);
    mha_tensor t;
    REQUIRE_OK(mha_npy_load(&t, path, MHA_F32));
    CHECK(t.shape[0] == 15);
    mha_tensor_free(&t);
    /* a new file gets 0666 less the umask */
    mode_t old_mask = umask(027);
    snprintf(path, sizeof path, "%s/new", dir);
    REQUIRE_OK(write_npy(path, 0));
    umask(old_mask);
    REQUIRE(stat(path, &sb) == 0);
    CHECK((sb.st_mode & 0777) == 0640);
    CHECK(count_temporaries(dir, 0) == 0);
    remove_dir(dir);
}

/* ---- non-regular targets -------------------------------------------------------- */

TEST(safe_write_fifo_target_is_written_and_never_removed) {
    char dir[64], fifo[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    REQUIRE(mkfifo(fifo, 0600) == 0);
    int reader = open(fifo, O_RDONLY | O_NONBLOCK); /* so the writer's open does not block */
    REQUIRE(reader >= 0);
    /* a good write goes straight into the pipe */
    REQUIRE_OK(write_npy(fifo, 0));
    uint8_t buf[4096];
    ssize_t got = read(reader, buf, sizeof buf);
    CHECK(got > 128 && memcmp(buf, "\x93NUMPY", 6) == 0);
    /* failed writes (ENOSPC) through every writer leave the FIFO in place */
    writer_fn writers[] = {write_npy, write_safetensors, write_stream, write_svg,
#ifdef MHA_HAVE_PNG
                           write_png,
#endif
    };
    for (size_t i = 0; i < sizeof writers / sizeof *writers; i++) {
        mha_test_fail_io(1, 1, MHA_IO_FAULT_NOSPACE);
        mha_status st = writers[i](fifo, 1);
        mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
        CHECK(st == MHA_ERR_IO);
        struct stat sb;
        CHECK(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
        while (read(reader, buf, sizeof buf) > 0) {
        }
    }
    close(reader);
    CHECK(count_temporaries(dir, 0) == 0);
    remove_dir(dir);
}

TEST(safe_write_missing_directory_names_the_path) {
    float w[4] = {1, 0, 0, 1};
    render_maps m = {1, 2, 2, w, NULL, NULL, NULL, 0};
    char err[256] = "";
    CHECK(render_svg_write(&m, "/nonexistent-dir/x.svg", err, sizeof err) == RENDER_ERR_IO);
    CHECK(strstr(err, "/nonexistent-dir/x.svg"));
    mha_safe_file *f = (mha_safe_file *)&m;
    CHECK_STATUS(mha_safe_file_open(&f, "/nonexistent-dir/x"), MHA_ERR_IO);
    CHECK(f == NULL);
    CHECK_STATUS(mha_safe_file_close(NULL, 1), MHA_OK);
    CHECK(mha_safe_file_stream(NULL) == NULL);
}

/* ---- forked children ----------------------------------------------------------- */

/* Reaps child pid (waitpid's status into *status) after removing what LLVM's
 * OpenMP runtime registered for it: libomp (the clang build's) records each
 * process that starts it in /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> and
 * removes that at exit, which a SIGKILLed or _exit()ing child never does.
 * The 300 kills below left ~260 such files a run, and a later process that
 * drew one of those pids aborted ("OMP: Error #15 ... found unknown library
 * already initialized") - a clang CLI test did, in CI.  The file is removed
 * while the child is a zombie (waitid WNOWAIT), so its pid cannot have been
 * taken by another process yet; with libgomp there is no such file. */
static pid_t reap_child(pid_t pid, int *status) {
    siginfo_t info;
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) == 0) {
        char reg[96];
        snprintf(reg, sizeof reg, "/dev/shm/__KMP_REGISTERED_LIB_%d_%d", (int)pid, (int)getuid());
        unlink(reg); /* absent (libgomp, or the child never started OpenMP): ENOENT */
    }
    return waitpid(pid, status, 0);
}

/* ---- a reader with the old file mapped -------------------------------------------- */

TEST(safe_write_mapped_reader_keeps_the_old_bytes) {
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) { /* the child maps, the path is rewritten smaller, the child reads on */
        enum { N = 1 << 18 };
        float *x = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++)
            x[i] = 1.0f;
        mha_tensor t;
        mha_tensor_init(&t, MHA_F32, x, 1, (int64_t[]){N});
        const char *names[] = {"x"};
        const mha_tensor *ts[] = {&t};
        mha_safetensors *st;
        mha_tensor view;
        if (mha_safetensors_write(path, names, ts, 1, NULL, NULL, 0) != MHA_OK ||
            mha_safetensors_open(&st, path) != MHA_OK ||
            mha_safetensors_view_f32(st, "x", &view) != MHA_OK)
            _exit(2);
        t.shape[0] = 16; /* the new file: 16 floats of 2 */
        for (int i = 0; i < 16; i++)
            x[i] = 2.0f;
        if (mha_safetensors_write(path, names, ts, 1, NULL, NULL, 0) != MHA_OK)
            _exit(3);
        double sum = 0;
        for (int i = 0; i < N; i++) /* in place, this would be SIGBUS past the new end */
            sum += ((const float *)view.data)[i];
        mha_safetensors_free(st);
        _exit(sum == (double)N ? 0 : 4);
    }
    int status = 0;
    REQUIRE(reap_child(pid, &status) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "mapped reader: %s %d", WIFSIGNALED(status) ? "signal" : "exit",
                  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    remove_dir(dir);
}

/* ---- SIGKILL at random points ----------------------------------------------------- */

enum { KILL_FLOATS = 1 << 14, KILL_TRIALS = 300 };

/* Writes version v of the kill test's file: KILL_FLOATS floats equal to v. */
static mha_status write_kill_version(const char *path, int v) {
    static float x[KILL_FLOATS];
    for (int i = 0; i < KILL_FLOATS; i++)
        x[i] = (float)v;
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, x, 1, (int64_t[]){KILL_FLOATS});
    const char *names[] = {"x"};
    const mha_tensor *ts[] = {&t};
    return mha_safetensors_write(path, names, ts, 1, NULL, NULL, 0);
}

/* The version the complete file at path holds, or -1 when it does not load whole. */
static int loaded_version(const char *path) {
    mha_safetensors *st;
    if (mha_safetensors_open(&st, path) != MHA_OK)
        return -1;
    mha_tensor v;
    int version = -1;
    if (mha_safetensors_view_f32(st, "x", &v) == MHA_OK && v.shape[0] == KILL_FLOATS) {
        const float *x = v.data;
        version = (int)x[0];
        for (int i = 1; i < KILL_FLOATS; i++)
            if (x[i] != x[0])
                version = -1;
    }
    mha_safetensors_free(st);
    return version;
}

TEST(safe_write_sigkill_never_leaves_a_broken_file) {
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(path, sizeof path, "%s/k.safetensors", dir);
    REQUIRE_OK(write_kill_version(path, 1));
    uint64_t r = 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    int broken = 0, versions_seen = 0, last = 1;
    for (int trial = 0; trial < KILL_TRIALS; trial++) {
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) /* rewrite the file over and over until killed */
            for (int v = 2 + 1000 * trial;; v++)
                if (write_kill_version(path, v) != MHA_OK)
                    _exit(1);
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        struct timespec ts = {0, (long)(r % 6000) * 1000}; /* 0-6 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        reap_child(pid, &status);
        int v = loaded_version(path);
        if (v < 1)
            broken++;
        versions_seen += v != last;
        last = v;
        count_temporaries(dir, 1); /* a killed writer's temporary is all it leaves */
    }
    if (broken)
        test_fail(__FILE__, __LINE__, "%d of %d kills left a file that does not load whole",
                  broken, KILL_TRIALS);
    CHECK(versions_seen > 0); /* the children did replace the file */
    printf("ok sigkill: %d trials, none broken; %d of them had replaced the file\n",
           KILL_TRIALS, versions_seen);
    remove_dir(dir);
}

/* ---- checkpoints ------------------------------------------------------------------ */

static void small_model(mha_model **m, mha_adamw *o) {
    mha_model_config c;
    mha_model_config_init(&c);
    c.vocab = 7, c.max_len = 5, c.dim = 8, c.heads = 2, c.ffn = 6, c.layers = 1;
    mha_adamw_options oo;
    mha_adamw_options_init(&oo);
    *m = NULL;
    if (mha_model_create(m, &c, 3) == MHA_OK && mha_adamw_create(o, mha_model_num_params(*m), &oo) != MHA_OK) {
        mha_model_free(*m);
        *m = NULL;
    }
}

static mha_status save_at(mha_model *m, mha_adamw *o, const char *dir, int64_t step, uint64_t run) {
    char wp[128], op[128];
    snprintf(wp, sizeof wp, "%s/model.safetensors", dir);
    snprintf(op, sizeof op, "%s/optimizer.safetensors", dir);
    o->step = step;
    const char *k[] = {"train.task"}, *v[] = {"sort"};
    mha_checkpoint_info info = {step, 3, run, 1, k, v};
    return mha_model_save_checkpoint(m, wp, op, o, &info);
}

static mha_status load_pair(const char *dir, const char *opt_dir) {
    char wp[128], op[128];
    snprintf(wp, sizeof wp, "%s/model.safetensors", dir);
    snprintf(op, sizeof op, "%s/optimizer.safetensors", opt_dir);
    mha_model *r = NULL;
    mha_adamw o;
    memset(&o, 0, sizeof o);
    mha_status st = mha_model_open(&r, wp, op, &o, NULL, NULL);
    mha_model_free(r);
    mha_adamw_free(&o);
    return st;
}

TEST(checkpoint_pair_of_two_steps_or_runs_is_refused) {
    char d20[64], d40[64], other[64], path[160];
    make_dir(d20, sizeof d20), make_dir(d40, sizeof d40), make_dir(other, sizeof other);
    REQUIRE(d20[0] && d40[0] && other[0]);
    mha_model *m;
    mha_adamw o;
    small_model(&m, &o);
    REQUIRE(m);
    REQUIRE_OK(save_at(m, &o, d20, 20, 0xabc));
    REQUIRE_OK(save_at(m, &o, d40, 40, 0xabc));
    REQUIRE_OK(save_at(m, &o, other, 40, 0xdef));
    CHECK_STATUS(load_pair(d40, d40), MHA_OK);
    /* model at step 40 beside the optimiser of step 20 (a crash between renames) */
    CHECK_STATUS(load_pair(d40, d20), MHA_ERR_FORMAT);
    CHECK_ERROR_MENTIONS(d40);
    CHECK_ERROR_MENTIONS(d20);
    CHECK_ERROR_MENTIONS("step 40");
    CHECK_ERROR_MENTIONS("step 20");
    /* same step, another run */
    CHECK_STATUS(load_pair(d40, other), MHA_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("run 0000000000000abc");
    CHECK_ERROR_MENTIONS("run 0000000000000def");
    /* no optimiser file: the message names the model file */
    snprintf(path, sizeof path, "%s/optimizer.safetensors", other);
    unlink(path);
    CHECK_STATUS(load_pair(d40, other), MHA_ERR_IO);
    CHECK_ERROR_MENTIONS("model.safetensors");
    CHECK_ERROR_MENTIONS("optimiser");
    /* the run's extra metadata is in the model file; a built-in key is refused */
    snprintf(path, sizeof path, "%s/model.safetensors", d40);
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, path));
    CHECK(mha_safetensors_metadata(st, "train.task") &&
          !strcmp(mha_safetensors_metadata(st, "train.task"), "sort"));
    CHECK(mha_safetensors_metadata(st, "run_id") &&
          !strcmp(mha_safetensors_metadata(st, "run_id"), "0000000000000abc"));
    mha_safetensors_free(st);
    const char *k[] = {"step"}, *v[] = {"7"};
    mha_checkpoint_info bad = {1, 1, 1, 1, k, v};
    CHECK_STATUS(mha_model_save_checkpoint(m, path, NULL, NULL, &bad), MHA_ERR_VALUE);
    CHECK_STATUS(mha_model_save_checkpoint(m, path, NULL, NULL, NULL), MHA_ERR_NULL);
    mha_model_free(m);
    mha_adamw_free(&o);
    remove_dir(d20), remove_dir(d40), remove_dir(other);
}

/* A failure at any step of a checkpoint save leaves the old pair (or, once
 * the optimiser file is renamed, a pair that load refuses). */
TEST(checkpoint_save_faults_leave_a_loadable_or_refused_pair) {
    char dir[64];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    mha_model *m;
    mha_adamw o;
    small_model(&m, &o);
    REQUIRE(m);
    int64_t points = 0, refused = 0;
    for (int64_t k = 1; k < 1000; k++) {
        REQUIRE_OK(save_at(m, &o, dir, 10, 0x77));
        int64_t before = mha_test_io_count();
        mha_test_fail_io(k, 0, MHA_IO_FAULT_NOSPACE);
        mha_status st = save_at(m, &o, dir, 11, 0x77);
        mha_test_fail_io(0, 0, MHA_IO_FAULT_FAIL);
        if (mha_test_io_count() - before < k) {
            CHECK(st == MHA_OK);
            break;
        }
        points++;
        CHECK(st == MHA_ERR_IO);
        mha_status ls = load_pair(dir, dir);
        refused += ls == MHA_ERR_FORMAT;
        CHECK(ls == MHA_OK || (ls == MHA_ERR_FORMAT && strstr(mha_last_error(), "not one checkpoint")));
        CHECK(count_temporaries(dir, 0) == 0);
    }
    CHECK(points >= 10); /* two files: create, writes, fsync, rename, directory fsync each */
    CHECK(refused >= 1); /* the model's rename failing after the optimiser's */
    mha_model_free(m);
    mha_adamw_free(&o);
    remove_dir(dir);
}

TEST(checkpoint_metadata_alone_allocates_no_model) {
    /* metadata promising 1024 layers of dim 65536 (terabytes), no tensors */
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    REQUIRE(dir[0]);
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    const char *k[] = {"step", "seed", "vocab", "max_len", "dim", "heads", "ffn",
                       "layers", "causal", "norm_first", "activation", "dropout", "layer_norm_eps"};
    const char *v[] = {"0", "1", "16777216", "1048576", "65536", "64", "1048576",
                       "1024", "0", "1", "1", "0", "1e-5"};
    REQUIRE_OK(mha_safetensors_write(path, NULL, NULL, 0, k, v, 13));
    size_t n;
    free(slurp(path, &n));
    CHECK(n < 512);
    mha_model *m = (mha_model *)path;
    int64_t live = mha_test_live_allocs();
    CHECK_STATUS(mha_model_open(&m, path, NULL, NULL, NULL, NULL), MHA_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("tensors");
    CHECK(m == NULL && mha_test_live_allocs() == live);
    /* one tensor of the wrong shape is named before anything is allocated */
    mha_model *good;
    mha_adamw o;
    small_model(&good, &o);
    REQUIRE(good);
    REQUIRE_OK(save_at(good, &o, dir, 1, 0));
    char wp[128];
    snprintf(wp, sizeof wp, "%s/model.safetensors", dir);
    mha_safetensors *st;
    REQUIRE_OK(mha_safetensors_open(&st, wp));
    int64_t nt = mha_safetensors_count(st);
    const char **names = calloc((size_t)nt, sizeof *names);
    const char **mk = calloc((size_t)mha_safetensors_metadata_count(st), sizeof *mk);
    const char **mv = calloc((size_t)mha_safetensors_metadata_count(st), sizeof *mv);
    mha_tensor *views = calloc((size_t)nt, sizeof *views);
    const mha_tensor **ts = calloc((size_t)nt, sizeof *ts);
    REQUIRE(names && mk && mv && views && ts);
    for (int64_t i = 0; i < nt; i++) {
        names[i] = mha_safetensors_name(st, i);
        REQUIRE_OK(mha_safetensors_view_f32(st, names[i], &views[i]));
        ts[i] = &views[i];
    }
    views[nt - 1].shape[0] -= 1; /* head.bias one short */
    for (int64_t i = 0; i < mha_safetensors_metadata_count(st); i++)
        mk[i] = mha_safetensors_metadata_key(st, i), mv[i] = mha_safetensors_metadata_value(st, i);
    REQUIRE_OK(mha_safetensors_write(path, names, ts, nt, mk, mv,
                                     mha_safetensors_metadata_count(st)));
    mha_safetensors_free(st);
    CHECK_STATUS(mha_model_open(&m, path, NULL, NULL, NULL, NULL), MHA_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("head.bias");
    free(names), free(mk), free(mv), free(views), free(ts);
    mha_model_free(good);
    mha_adamw_free(&o);
    remove_dir(dir);
}
