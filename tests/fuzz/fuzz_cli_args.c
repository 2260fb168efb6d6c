/* fuzz_cli_args.c - libFuzzer target for the `mha` command line; without
 * MHA_LIBFUZZER a plain program replaying files and directories:
 *     fuzz_cli_args tests/corpus/cli_args
 *
 * An input is an argument vector: tokens separated by NUL or newline (at
 * most 48 tokens of at most 200 bytes).  The first token is the subcommand;
 * it goes through the real dispatcher (cli/main.c built with main renamed
 * mha_cli_main), so --help, --version and unknown commands are covered too.
 * `bench`, `demo` and `train` are skipped (they time, print or train for
 * seconds to minutes; little to parse), and `embed` and `search` (they read
 * standard input and load the real model), unless the input asks for --help.
 *
 * Sandbox: the target works inside a private temporary directory holding
 * small valid inputs (q.npy k.npy v.npy kpm.npy am.npy, q4.npy k4.npy v4.npy,
 * w.safetensors, tokens.txt), and every '/' in a token becomes '_', so any
 * path a token names is a file of that directory: parsing reaches the
 * loaders and the (tiny) computation, and outputs land there too.  Files the
 * CLI writes are removed every 256 inputs.  Any exit status is fine;
 * crashes, sanitizer reports and leaks are findings.
 */
#include "cli.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int mha_cli_main(int argc, char **argv); /* cli/main.c, main renamed */

#define MAX_TOKENS 48
#define MAX_TOKEN 200

static const char *const keep[] = {"q.npy",  "k.npy",  "v.npy",  "kpm.npy",       "am.npy",
                                   "q4.npy", "k4.npy", "v4.npy", "w.safetensors", "tokens.txt"};
#define N_KEEP (sizeof keep / sizeof *keep)

static int save(const char *path, int ndim, const int64_t *shape, uint64_t seed, mha_dtype as) {
    float buf[256];
    mha_tensor t;
    mha_tensor_init(&t, MHA_F32, buf, ndim, shape);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    mha_randn(buf, n, seed, 1.0f);
    if (as == MHA_BOOL) {
        static uint8_t mask[256];
        for (int64_t i = 0; i < n; i++)
            mask[i] = buf[i] > 0.8f;
        mha_tensor_init(&t, MHA_BOOL, mask, ndim, shape);
    }
    return mha_npy_save(&t, path, as) == MHA_OK;
}

static void sweep(void);

/* Removes the sandbox when the process exits (libFuzzer ends with exit()). */
static void sandbox_remove(void) {
    char here[4096];
    if (!getcwd(here, sizeof here) || strncmp(here, "/tmp/mha-fuzz-cli-", 18))
        return;
    sweep();
    for (size_t k = 0; k < N_KEEP; k++)
        remove(keep[k]);
    if (chdir("/") == 0)
        rmdir(here);
}

/* The sandbox: E = 4, H = 2, B = 1, L = 3, S = 5. */
static int sandbox(void) {
    static int ready;
    if (ready)
        return ready > 0;
    ready = -1;
    static char dir[] = "/tmp/mha-fuzz-cli-XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0)
        return 0;
    atexit(sandbox_remove);
    mha_set_num_threads(1);
    int ok = save("q.npy", 3, (int64_t[]){1, 3, 4}, 1, MHA_F32) &&
             save("k.npy", 3, (int64_t[]){1, 5, 4}, 2, MHA_F32) &&
             save("v.npy", 3, (int64_t[]){1, 5, 4}, 3, MHA_F32) &&
             save("kpm.npy", 2, (int64_t[]){1, 5}, 4, MHA_BOOL) &&
             save("am.npy", 2, (int64_t[]){3, 5}, 5, MHA_F32) &&
             save("q4.npy", 4, (int64_t[]){1, 2, 3, 4}, 6, MHA_F32) &&
             save("k4.npy", 4, (int64_t[]){1, 2, 5, 4}, 7, MHA_F32) &&
             save("v4.npy", 4, (int64_t[]){1, 2, 5, 4}, 8, MHA_F32);
    float w_in[12 * 4], b_in[12], w_out[16], b_out[4];
    mha_randn(w_in, 48, 9, 0.5f), mha_randn(b_in, 12, 10, 0.5f);
    mha_randn(w_out, 16, 11, 0.5f), mha_randn(b_out, 4, 12, 0.5f);
    mha_tensor t[4];
    mha_tensor_init(&t[0], MHA_F32, w_in, 2, (int64_t[]){12, 4});
    mha_tensor_init(&t[1], MHA_F32, b_in, 1, (int64_t[]){12});
    mha_tensor_init(&t[2], MHA_F32, w_out, 2, (int64_t[]){4, 4});
    mha_tensor_init(&t[3], MHA_F32, b_out, 1, (int64_t[]){4});
    const char *names[] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    const mha_tensor *ts[] = {&t[0], &t[1], &t[2], &t[3]};
    ok = ok && mha_safetensors_write("w.safetensors", names, ts, 4, NULL, NULL, 0) == MHA_OK;
    FILE *f = fopen("tokens.txt", "w");
    ok = ok && f && fputs("the cat sat\n", f) >= 0;
    if (f)
        fclose(f);
    ready = ok ? 1 : -1;
    return ok;
}

/* Removes what the CLI wrote into the sandbox. */
static void sweep(void) {
    DIR *d = opendir(".");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t i = 0;
        while (i < N_KEEP && strcmp(e->d_name, keep[i]))
            i++;
        if (i == N_KEEP)
            remove(e->d_name);
    }
    if (d)
        closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned long runs;
    if (!sandbox())
        return 0;
    static char tokens[MAX_TOKENS][MAX_TOKEN + 1];
    static char prog[] = "mha";
    char *argv[MAX_TOKENS + 2];
    int argc = 0;
    argv[argc++] = prog;
    size_t i = 0;
    while (i <= size && argc <= MAX_TOKENS) {
        size_t n = 0;
        char *tok = tokens[argc - 1];
        for (; i < size && data[i] != '\0' && data[i] != '\n'; i++)
            if (n < MAX_TOKEN)
                tok[n++] = data[i] == '/' ? '_' : (char)data[i];
        tok[n] = '\0';
        argv[argc++] = tok;
        i++; /* past the separator */
    }
    argv[argc] = NULL;
    bool help = false;
    for (int a = 2; a < argc; a++)
        help = help || !strcmp(argv[a], "--help");
    if (argc >= 2 && !help &&
        (!strcmp(argv[1], "bench") || !strcmp(argv[1], "demo") || !strcmp(argv[1], "train") ||
         !strcmp(argv[1], "embed") || !strcmp(argv[1], "search")))
        return 0;
    (void)mha_cli_main(argc, argv);
    if (++runs % 256 == 0)
        sweep();
    return 0;
}

#ifndef MHA_LIBFUZZER
#include "replay.h"
int main(int argc, char **argv) {
    char cwd[4096];
    /* replay.h opens paths relative to where we started: make them absolute
     * before the sandbox moves us */
    if (!getcwd(cwd, sizeof cwd))
        return 1;
    char **abs = calloc((size_t)argc + 1, sizeof *abs);
    for (int k = 0; abs && k < argc; k++) {
        abs[k] = malloc(strlen(cwd) + strlen(argv[k]) + 2);
        if (abs[k])
            sprintf(abs[k], "%s%s%s", argv[k][0] == '/' || k == 0 ? "" : cwd,
                    argv[k][0] == '/' || k == 0 ? "" : "/", argv[k]);
    }
    if (!abs || !sandbox())
        return 1;
    int rc = fuzz_replay_main(argc, abs, LLVMFuzzerTestOneInput);
    for (int k = 0; k < argc; k++)
        free(abs[k]);
    free(abs);
    return rc;
}
#endif
