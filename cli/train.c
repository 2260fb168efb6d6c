/* train.c - `mha train`: trains a small Transformer (mha_model) with AdamW
 * on a built-in task that needs attention, shows progress, reports the
 * held-out accuracy, writes a checkpoint and the loss curve.
 *
 * Tasks (digits 0-9, PAD = 10, sequences of min-len..max-len digits padded
 * to max-len):
 *   reverse  output position i holds digit n-1-i of the n-digit input
 *   sort     output position i holds the i-th smallest input digit
 * Targets on PAD positions are ignored.  With --causal (a decoder-only
 * stack, which cannot see later positions) the same task is a language model:
 * the sequence is the n digits, SEP, then the n answer digits, each position
 * predicts the next token, and only the answer is scored (teacher forcing).
 * The batch of step s is a pure
 * function of (seed, s), so a resumed run sees the same data as a straight
 * one; the held-out set comes from another stream of the same seed.
 *
 * This file parses, loops and prints; the model math is src/model.c.
 */
#include "cli.h"
#include "mha_inputs.h"
#include "render.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAD 10
#define SEP 11 /* --causal: between the input and the answer */

#ifdef MHA_HAVE_CBLAS
/* OpenBLAS's own pool: its threads only spin on matrices this small */
void openblas_set_num_threads(int num_threads);
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: mha train [--task reverse|sort] [--steps N] [--seed S] [--layers N]\n"
            "                 [--heads H] [--dim E] [--ffn F] [--batch B] [--lr LR]\n"
            "                 [--min-len N] [--max-len N] [--causal] [--post-norm]\n"
            "                 [--dropout P] [--clip C] [--weight-decay W] [--eval N]\n"
            "                 [--out DIR] [--resume DIR] [--save-every N] [--threads N]\n"
            "                 [--quiet]\n"
            "\n"
            "Trains token + position embeddings, N Transformer encoder layers (or a\n"
            "causal decoder-only stack) and a linear head with AdamW on a digit task,\n"
            "then prints the exact-token accuracy on a held-out set as 'accuracy: X'.\n"
            "\n"
            "  --task reverse|sort   default reverse (output the input backwards)\n"
            "  --steps N             total optimiser steps (default 600)\n"
            "  --seed S              parameters, data and dropout (default 1)\n"
            "  --layers/--heads/--dim/--ffn   model size (default 2 / 4 / 64 / 128)\n"
            "  --batch B             sequences per step (default 32)\n"
            "  --lr LR               peak learning rate (default 3e-3; linear warm-up\n"
            "                        over the first 100 steps, then constant)\n"
            "  --min-len/--max-len   digits per sequence (default 8 / 12)\n"
            "  --causal              a decoder-only stack: the task becomes next-token\n"
            "                        prediction of 'digits SEP answer', answer scored\n"
            "  --clip C              clip_grad_norm_ (default 1.0; 0 = off)\n"
            "  --out DIR             checkpoint DIR/model.safetensors (state_dict names),\n"
            "                        DIR/optimizer.safetensors, DIR/loss.tsv, DIR/loss.svg\n"
            "                        (and DIR/loss.png with libpng),\n"
            "                        DIR/sample_tokens.npy, DIR/sample_logits.npy\n"
            "                        (default mha-train)\n"
            "  --resume DIR          continue the run checkpointed in DIR up to --steps\n"
            "                        (its model, optimiser, step, seed and flags: an omitted\n"
            "                        flag takes the stored value, a conflicting one is an\n"
            "                        error); writes to --out, loss.tsv keeps its history\n"
            "  --save-every N        also checkpoint to --out every N steps (default 0: off)\n"
            "  --eval N              held-out sequences (default 1000)\n"
            "  --threads N           threads per call (default 1: the default model's\n"
            "                        matrices are too small to split; 0 = OpenMP's\n"
            "                        default).  Results are bit-identical for any N.\n"
            "\n"
            "exit status: 0 ok, 2 bad input, 1 internal failure\n");
}

/* ---- the task ------------------------------------------------------------------- */

typedef struct task {
    int sort, causal;
    int64_t min_len, max_len;
    int64_t T, V; /* sequence length and vocabulary of the layout */
} task;

/* The layout: T = max_len (V = 11: digits, PAD) or, causal, 2 max_len + 1
 * (V = 12: digits, PAD, SEP). */
static void task_layout(task *t) {
    t->T = t->causal ? 2 * t->max_len + 1 : t->max_len;
    t->V = t->causal ? 12 : 11;
}

static uint64_t mix64(uint64_t x) { return mha_splitmix64(x); }

/* B sequences (B,T) and targets for (seed, stream, index). */
static void make_batch(const task *t, int64_t *tok, int64_t *tgt, int64_t B, uint64_t seed,
                       uint64_t stream, uint64_t index) {
    const int64_t T = t->T;
    uint64_t s = mix64(seed ^ mix64(stream ^ mix64(index)));
    for (int64_t b = 0; b < B; b++) {
        int64_t *x = tok + b * T, *y = tgt + b * T;
        s = mix64(s);
        int64_t n = t->min_len + (int64_t)(s % (uint64_t)(t->max_len - t->min_len + 1));
        for (int64_t i = 0; i < T; i++) {
            s = mix64(s);
            x[i] = i < n ? (int64_t)(s % 10) : PAD;
        }
        if (t->sort) {
            int64_t count[10] = {0}, k = 0;
            for (int64_t i = 0; i < n; i++)
                count[x[i]]++;
            for (int64_t d = 0; d < 10; d++)
                while (count[d]--)
                    y[k++] = d;
        } else {
            for (int64_t i = 0; i < n; i++)
                y[i] = x[n - 1 - i];
        }
        for (int64_t i = n; i < T; i++)
            y[i] = -1;
        if (t->causal) {
            /* x: digits, SEP, answer, PAD...; y[i] = x[i+1] on the answer's
             * positions (SEP predicts its first digit) */
            x[n] = SEP;
            for (int64_t i = 0; i < n; i++)
                x[n + 1 + i] = y[i];
            for (int64_t i = 0; i < T; i++)
                y[i] = i >= n && i < 2 * n ? x[i + 1] : -1;
        }
    }
}

/* ---- the loss curve (drawn by render.c) ------------------------------------------ */

/* DIR/loss.svg or .png: steps (n) and loss (n), raw in light blue, a running
 * mean (decay 0.95) in dark.  0, or -1 with the message in err. */
static int write_curve(const char *path, int png, const int64_t *steps, const float *loss,
                       int64_t n, const char *title, char *err, size_t errlen) {
    float *mean = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!mean) {
        snprintf(err, errlen, "loss curve: out of memory");
        return -1;
    }
    double avg = n ? loss[0] : 0;
    for (int64_t i = 0; i < n; i++)
        mean[i] = (float)(avg = 0.95 * avg + 0.05 * loss[i]);
    const render_series series[2] = {{"per step", loss, {158, 195, 240}, 1},
                                     {"running mean", mean, {31, 78, 156}, 2}};
    const render_plot plot = {n, steps, 2, series, title, "step", "cross-entropy loss"};
    render_status st = png ? render_plot_png_write(&plot, path, err, errlen)
                           : render_plot_svg_write(&plot, path, err, errlen);
    free(mean);
    return st == RENDER_OK ? 0 : -1;
}

/* DIR/loss.tsv: "step\tloss" lines.  0, or -1 with mha_last_error() set. */
static int write_losses(const char *path, const int64_t *steps, const float *loss, int64_t n) {
    mha_safe_file *out;
    if (mha_safe_file_open(&out, path) != MHA_OK)
        return -1;
    FILE *f = mha_safe_file_stream(out);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, "%lld\t%.9g\n", (long long)steps[i], (double)loss[i]);
    return mha_safe_file_close(out, 1) == MHA_OK ? 0 : -1;
}

/* ---- progress ---------------------------------------------------------------------- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress(int64_t step, int64_t total, int64_t first, float loss, double tok_s,
                     double elapsed, int tty) {
    const int width = 24;
    double frac = total ? (double)step / (double)total : 1.0;
    int fill = (int)(frac * width);
    double left = step > first ? elapsed / (double)(step - first) * (double)(total - step) : 0;
    char bar[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "%s[%s] step %lld/%lld  loss %.4f  %.0f tok/s  left %d:%02d%s", tty ? "\r" : "",
            bar, (long long)step, (long long)total, (double)loss, tok_s, (int)left / 60,
            (int)left % 60, tty ? "   " : "\n");
    fflush(stderr);
}

/* ---- options ------------------------------------------------------------------------ */

static int parse_i64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi,
                     int64_t *out) {
    int64_t x;
    if (!cli_parse_i64(v, lo, hi, &x)) {
        fprintf(stderr, "mha %s: %s wants an integer in %lld..%lld, got '%s'\n", cmd, flag,
                (long long)lo, (long long)hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_f(const char *cmd, const char *flag, const char *v, double lo, double hi,
                   double *out) {
    double x;
    if (!cli_parse_f64(v, &x) || !(x >= lo && x <= hi)) {
        fprintf(stderr, "mha %s: %s wants a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* Reads DIR/loss.tsv ("step\tloss" lines) up to `upto` steps. */
static int64_t read_losses(const char *dir, int64_t upto, int64_t *steps, float *loss, int64_t cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loss.tsv", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int64_t n = 0;
    long long s;
    float v;
    while (n < cap && fscanf(f, "%lld\t%f\n", &s, &v) == 2)
        if (s <= upto)
            steps[n] = s, loss[n] = v, n++;
    fclose(f);
    return n;
}

/* Accuracy over the held-out set: exact tokens, and whole sequences. */
static mha_status evaluate(mha_model *m, const task *t, uint64_t seed, int64_t n_eval,
                           int64_t B, double *tok_acc, double *seq_acc, float *eval_loss,
                           const char *dump_dir) {
    const int64_t T = t->T, V = t->V;
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)(B * T));
    int64_t *tgt = malloc(sizeof(int64_t) * (size_t)(B * T));
    if (!tok || !tgt) {
        free(tok), free(tgt);
        return MHA_ERR_NOMEM;
    }
    int64_t right = 0, total = 0, seq_right = 0, seqs = 0;
    double loss_sum = 0;
    mha_status st = MHA_OK;
    for (int64_t done = 0, batch = 0; st == MHA_OK && done < n_eval; done += B, batch++) {
        int64_t nb = n_eval - done < B ? n_eval - done : B;
        make_batch(t, tok, tgt, nb, seed, 0xE7A1, (uint64_t)batch);
        float loss;
        st = mha_model_forward(m, tok, tgt, nb, T, 0, 0, &loss);
        if (st != MHA_OK)
            break;
        loss_sum += loss * (double)nb;
        const float *z = mha_model_logits(m);
        for (int64_t b = 0; b < nb; b++) {
            int ok = 1;
            for (int64_t i = 0; i < T; i++) {
                const int64_t y = tgt[b * T + i];
                if (y < 0)
                    continue;
                const float *zr = z + (b * T + i) * V;
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    if (zr[v] > zr[best])
                        best = v;
                right += best == y, total++;
                ok &= best == y;
            }
            seq_right += ok, seqs++;
        }
        if (batch == 0 && dump_dir) {
            /* the first held-out batch and its logits, for outside checks */
            char path[4096];
            mha_tensor tt, lt;
            float *tf = malloc(sizeof(float) * (size_t)(nb * T));
            if (tf) {
                for (int64_t i = 0; i < nb * T; i++)
                    tf[i] = (float)tok[i];
                mha_tensor_init(&tt, MHA_F32, tf, 2, (int64_t[]){nb, T});
                mha_tensor_init(&lt, MHA_F32, (void *)z, 3, (int64_t[]){nb, T, V});
                snprintf(path, sizeof path, "%s/sample_tokens.npy", dump_dir);
                st = mha_npy_save(&tt, path, MHA_F32);
                snprintf(path, sizeof path, "%s/sample_logits.npy", dump_dir);
                if (st == MHA_OK)
                    st = mha_npy_save(&lt, path, MHA_F32);
                free(tf);
            }
        }
    }
    *tok_acc = total ? (double)right / (double)total : 0;
    *seq_acc = seqs ? (double)seq_right / (double)seqs : 0;
    *eval_loss = (float)(n_eval ? loss_sum / (double)n_eval : 0);
    free(tok), free(tgt);
    return st;
}

/* ---- the run's flags, stored in the checkpoint --------------------------------------- */

/* A flag that shapes the run.  Its value is kept as text in the model
 * file's metadata under "train.<name>"; a resume takes an omitted flag from
 * there and refuses a conflicting one. */
typedef struct run_flag {
    const char *flag;             /* "--task"                                    */
    int64_t *i;                   /* exactly one of i, d, b points at the value  */
    double *d;
    int *b;
    const char *const *names;     /* b: the words for 0 and 1 (NULL: "0"/"1")    */
    int given;                    /* on the command line                         */
} run_flag;

static void flag_text(const run_flag *f, char *buf, size_t n) {
    if (f->i)
        snprintf(buf, n, "%lld", (long long)*f->i);
    else if (f->d) { /* the shortest text that reads back exactly */
        snprintf(buf, n, "%.15g", *f->d);
        if (strtod(buf, NULL) != *f->d)
            snprintf(buf, n, "%.17g", *f->d);
    }
    else
        snprintf(buf, n, "%s", f->names ? f->names[*f->b != 0] : *f->b ? "1" : "0");
}

/* Sets the flag from stored text; -1 when the text is not a value of it. */
static int flag_set(const run_flag *f, const char *text) {
    if (f->i) {
        return cli_parse_i64(text, INT64_MIN, INT64_MAX, f->i) ? 0 : -1;
    } else if (f->d) {
        return cli_parse_f64(text, f->d) ? 0 : -1;
    } else {
        const char *no = f->names ? f->names[0] : "0", *yes = f->names ? f->names[1] : "1";
        if (strcmp(text, no) && strcmp(text, yes))
            return -1;
        *f->b = !strcmp(text, yes);
        return 0;
    }
}

static void flag_key(const run_flag *f, char *buf, size_t n) {
    snprintf(buf, n, "train.%s", f->flag + 2);
}

/* Merges the flags stored in the checkpoint `path` into flags: an omitted
 * flag takes the stored value (listed on stderr, --quiet or not), a given
 * one must agree.
 * Returns CLI_OK or CLI_BAD_INPUT (message printed). */
static int merge_stored_flags(const char *path, run_flag *flags, int n, uint64_t *run_id) {
    mha_safetensors *st;
    mha_status status = mha_safetensors_open(&st, path);
    if (status != MHA_OK) /* a missing or unreadable checkpoint is bad input (2) */
        return cli_input_fail("train", "--resume", status);
    const char *run = mha_safetensors_metadata(st, "run_id");
    if (run)
        *run_id = strtoull(run, NULL, 16);
    char taken[1024] = "", key[64], given[64];
    size_t used = 0;
    int rc = CLI_OK, stored = 0;
    for (int k = 0; k < n && rc == CLI_OK; k++) {
        run_flag *f = &flags[k];
        flag_key(f, key, sizeof key);
        const char *v = mha_safetensors_metadata(st, key);
        if (!v)
            continue;
        stored++;
        flag_text(f, given, sizeof given);
        if (f->given && strcmp(v, given) != 0) {
            fprintf(stderr, "mha train: %s %s conflicts with the checkpoint's %s %s (%s); "
                            "omit the flag to continue the run as it was\n",
                    f->flag, given, f->flag, v, path);
            rc = CLI_BAD_INPUT;
        } else if (!f->given) {
            if (flag_set(f, v) != 0) {
                fprintf(stderr, "mha train: %s: metadata %s = '%s' is not a value of %s\n", path,
                        key, v, f->flag);
                rc = CLI_BAD_INPUT;
            } else if (used < sizeof taken) {
                used += (size_t)snprintf(taken + used, sizeof taken - used, " %s %s", f->flag, v);
            }
        }
    }
    if (rc == CLI_OK && stored == 0)
        fprintf(stderr, "mha train: %s records no run flags (an older checkpoint): the given or "
                        "default flags apply\n", path);
    else if (rc == CLI_OK && used)
        fprintf(stderr, "mha train: resuming with the checkpoint's%s\n", taken);
    mha_safetensors_free(st);
    return rc;
}

/* A run id for a fresh run: random (getrandom), never 0. */
static uint64_t new_run_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
        id = mix64((uint64_t)time(NULL) ^ mix64((uint64_t)getpid()) ^ (uint64_t)(uintptr_t)&id);
    return id ? id : 1;
}

/* The run's checkpoint in dir: model + optimiser (one unit: same step and
 * run id), then loss.tsv (history up to that step).  CLI_OK or the failure's
 * exit code (message printed). */
static int save_checkpoint(const char *dir, mha_model *m, const mha_adamw *opt, int64_t step,
                           uint64_t seed, uint64_t run_id, const run_flag *flags, int n_flags,
                           const int64_t *hist_step, const float *hist_loss, int64_t n_hist) {
    char path[4096], opath[4096];
    char keys[32][64], vals[32][64];
    const char *kp[32], *vp[32];
    for (int k = 0; k < n_flags && k < 32; k++) {
        flag_key(&flags[k], keys[k], sizeof keys[k]);
        flag_text(&flags[k], vals[k], sizeof vals[k]);
        kp[k] = keys[k], vp[k] = vals[k];
    }
    mha_checkpoint_info info = {step, seed, run_id, n_flags < 32 ? n_flags : 32, kp, vp};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/optimizer.safetensors", dir);
    mha_status st = mha_model_save_checkpoint(m, path, opath, opt, &info);
    if (st != MHA_OK)
        return cli_fail("train", st, path);
    snprintf(path, sizeof path, "%s/loss.tsv", dir);
    if (write_losses(path, hist_step, hist_loss, n_hist) != 0) {
        fprintf(stderr, "mha train: %s\n", mha_last_error());
        return CLI_INTERNAL;
    }
    return CLI_OK;
}

int cli_train(int argc, char **argv) {
    const char *cmd = "train", *out_dir = "mha-train", *resume = NULL;
    int64_t steps = 600, seed = 1, layers = 2, heads = 4, dim = 64, ffn = 128, batch = 32;
    int64_t min_len = 8, max_len = 12, n_eval = 1000, threads = 1, save_every = 0;
    double lr = 3e-3, dropout = 0.0, clip = 1.0, wd = 1e-2;
    int causal = 0, post_norm = 0, quiet = 0;
    task t = {0, 0, 0, 0, 0, 0};
    static const char *const task_names[2] = {"reverse", "sort"};
    run_flag flags[] = {
        {"--task", NULL, NULL, &t.sort, task_names, 0}, {"--seed", &seed, NULL, NULL, NULL, 0},
        {"--batch", &batch, NULL, NULL, NULL, 0},       {"--min-len", &min_len, NULL, NULL, NULL, 0},
        {"--max-len", &max_len, NULL, NULL, NULL, 0},   {"--layers", &layers, NULL, NULL, NULL, 0},
        {"--heads", &heads, NULL, NULL, NULL, 0},       {"--dim", &dim, NULL, NULL, NULL, 0},
        {"--ffn", &ffn, NULL, NULL, NULL, 0},           {"--lr", NULL, &lr, NULL, NULL, 0},
        {"--dropout", NULL, &dropout, NULL, NULL, 0},   {"--clip", NULL, &clip, NULL, NULL, 0},
        {"--weight-decay", NULL, &wd, NULL, NULL, 0},   {"--causal", NULL, NULL, &causal, NULL, 0},
        {"--post-norm", NULL, NULL, &post_norm, NULL, 0},
    };
    const int n_flags = (int)(sizeof flags / sizeof *flags);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--task")) {
            if (v && !strcmp(v, "reverse"))
                t.sort = 0;
            else if (v && !strcmp(v, "sort"))
                t.sort = 1;
            else {
                fprintf(stderr, "mha train: --task wants reverse or sort, got '%s'\n", v ? v : "");
                return CLI_BAD_INPUT;
            }
        } else if (!strcmp(a, "--steps")) rc = parse_i64(cmd, a, v, 0, 100000000, &steps);
        else if (!strcmp(a, "--seed")) rc = parse_i64(cmd, a, v, 0, INT64_MAX, &seed);
        else if (!strcmp(a, "--layers")) rc = parse_i64(cmd, a, v, 1, 64, &layers);
        else if (!strcmp(a, "--heads")) rc = parse_i64(cmd, a, v, 1, 1024, &heads);
        else if (!strcmp(a, "--dim")) rc = parse_i64(cmd, a, v, 1, 4096, &dim);
        else if (!strcmp(a, "--ffn")) rc = parse_i64(cmd, a, v, 1, 16384, &ffn);
        else if (!strcmp(a, "--batch")) rc = parse_i64(cmd, a, v, 1, 65536, &batch);
        else if (!strcmp(a, "--min-len")) rc = parse_i64(cmd, a, v, 1, 256, &min_len);
        else if (!strcmp(a, "--max-len")) rc = parse_i64(cmd, a, v, 1, 256, &max_len);
        else if (!strcmp(a, "--eval")) rc = parse_i64(cmd, a, v, 1, 1000000, &n_eval);
        else if (!strcmp(a, "--threads")) rc = parse_i64(cmd, a, v, 0, 1024, &threads);
        else if (!strcmp(a, "--save-every")) rc = parse_i64(cmd, a, v, 0, 100000000, &save_every);
        else if (!strcmp(a, "--lr")) rc = parse_f(cmd, a, v, 0, 10, &lr);
        else if (!strcmp(a, "--dropout")) rc = parse_f(cmd, a, v, 0, 0.99, &dropout);
        else if (!strcmp(a, "--clip")) rc = parse_f(cmd, a, v, 0, 1e9, &clip);
        else if (!strcmp(a, "--weight-decay")) rc = parse_f(cmd, a, v, 0, 10, &wd);
        else if (!strcmp(a, "--out") && v) out_dir = v;
        else if (!strcmp(a, "--resume") && v) resume = v;
        else {
            takes = 0;
            if (!strcmp(a, "--causal")) causal = 1;
            else if (!strcmp(a, "--post-norm")) post_norm = 1;
            else if (!strcmp(a, "--quiet")) quiet = 1;
            else {
                fprintf(stderr, "mha train: unknown or incomplete option '%s' (see --help)\n", a);
                return CLI_BAD_INPUT;
            }
        }
        if (rc)
            return CLI_BAD_INPUT;
        for (int k = 0; k < n_flags; k++)
            flags[k].given |= !strcmp(a, flags[k].flag);
        i += takes;
    }
    uint64_t run_id = 0;
    char path[4096], opath[4096];
    if (resume) { /* the stored run flags first: they decide the task's layout */
        snprintf(path, sizeof path, "%s/model.safetensors", resume);
        int rc = merge_stored_flags(path, flags, n_flags, &run_id);
        if (rc != CLI_OK)
            return rc;
    }
    if (min_len > max_len) {
        fprintf(stderr, "mha train: --min-len %lld exceeds --max-len %lld\n", (long long)min_len,
                (long long)max_len);
        return CLI_BAD_INPUT;
    }
    t.min_len = min_len, t.max_len = max_len, t.causal = causal;
    task_layout(&t);
    mha_set_num_threads((int)threads);
#ifdef MHA_HAVE_CBLAS
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1); /* 2x faster here (sched_yield storms otherwise) */
#endif
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "mha train: cannot create %s: %s\n", out_dir, strerror(errno));
        return CLI_INTERNAL;
    }

    /* the model and optimiser: fresh, or from the checkpoint */
    mha_model *m = NULL;
    mha_adamw opt;
    memset(&opt, 0, sizeof opt);
    int64_t start = 0;
    uint64_t useed = (uint64_t)seed;
    mha_status st;
    if (resume) {
        snprintf(path, sizeof path, "%s/model.safetensors", resume);
        snprintf(opath, sizeof opath, "%s/optimizer.safetensors", resume);
        st = mha_model_open(&m, path, opath, &opt, &start, &useed);
        if (st != MHA_OK) /* a missing or unreadable checkpoint is bad input (2) */
            return cli_input_fail(cmd, "--resume", st);
        t.causal = mha_model_get_config(m)->causal; /* the run's layout */
        task_layout(&t);
        if (mha_model_get_config(m)->max_len != t.T || mha_model_get_config(m)->vocab != t.V) {
            fprintf(stderr, "mha train: the checkpoint's max_len %lld / vocab %lld do not fit "
                            "--max-len %lld\n",
                    (long long)mha_model_get_config(m)->max_len,
                    (long long)mha_model_get_config(m)->vocab, (long long)max_len);
            mha_model_free(m), mha_adamw_free(&opt);
            return CLI_BAD_INPUT;
        }
    } else {
        mha_model_config c;
        mha_model_config_init(&c);
        c.vocab = t.V, c.max_len = t.T, c.dim = dim, c.heads = heads, c.ffn = ffn;
        c.layers = layers, c.norm_first = !post_norm;
        c.causal = causal ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
        c.dropout = (float)dropout;
        st = mha_model_create(&m, &c, useed);
        mha_adamw_options o;
        mha_adamw_options_init(&o);
        o.lr = lr, o.weight_decay = wd, o.max_grad_norm = clip;
        if (st == MHA_OK)
            st = mha_adamw_create(&opt, mha_model_num_params(m), &o);
        if (st != MHA_OK) {
            mha_model_free(m);
            return cli_fail(cmd, st, "model");
        }
        run_id = new_run_id();
    }
    if (run_id == 0) /* resuming a checkpoint from before run ids: the run gets one now */
        run_id = new_run_id();
    if (resume && steps <= start)
        fprintf(stderr, "mha train: --steps %lld is not beyond the checkpoint's step %lld: "
                        "nothing to train\n", (long long)steps, (long long)start);
    const mha_model_config *c = mha_model_get_config(m);
    if (!quiet)
        fprintf(stderr,
                "mha train: task %s, %lld-%lld digits; %lld layers%s, %lld heads, dim %lld, "
                "ffn %lld (%lld parameters); batch %lld, steps %lld..%lld, seed %llu\n",
                t.sort ? "sort" : "reverse", (long long)min_len, (long long)max_len,
                (long long)c->layers, c->causal ? " (causal)" : "", (long long)c->heads,
                (long long)c->dim, (long long)c->ffn, (long long)mha_model_num_params(m),
                (long long)batch, (long long)start, (long long)steps,
                (unsigned long long)useed);

    const int64_t T = t.T, cap = (steps > start ? steps : start) + 1;
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)(batch * T));
    int64_t *tgt = malloc(sizeof(int64_t) * (size_t)(batch * T));
    int64_t *hist_step = malloc(sizeof(int64_t) * (size_t)cap);
    float *hist_loss = malloc(sizeof(float) * (size_t)cap);
    if (!tok || !tgt || !hist_step || !hist_loss) {
        fprintf(stderr, "mha train: out of memory\n");
        free(tok), free(tgt), free(hist_step), free(hist_loss);
        mha_model_free(m), mha_adamw_free(&opt);
        return CLI_INTERNAL;
    }
    int64_t n_hist = resume ? read_losses(resume, start, hist_step, hist_loss, cap) : 0;
    const int tty = isatty(2) && !quiet;
    const double t0 = now();
    double last_print = 0;
    int64_t tokens_seen = 0;
    const double base_lr = resume ? opt.opt.lr : lr;
    const int64_t warmup = 100;
    st = MHA_OK;
    for (int64_t s = start; s < steps && st == MHA_OK; s++) {
        make_batch(&t, tok, tgt, batch, useed, 0x7A1, (uint64_t)s);
        /* linear warm-up then constant: a function of the step only */
        opt.opt.lr = s < warmup ? base_lr * (double)(s + 1) / (double)warmup : base_lr;
        float loss;
        mha_model_zero_grad(m);
        st = mha_model_forward(m, tok, tgt, batch, T, 1, mix64(useed ^ (uint64_t)s), &loss);
        if (st == MHA_OK)
            st = mha_model_backward(m);
        if (st == MHA_OK)
            st = mha_adamw_step(&opt, mha_model_params(m), mha_model_grads(m), NULL);
        if (n_hist < cap)
            hist_step[n_hist] = s + 1, hist_loss[n_hist++] = loss;
        tokens_seen += batch * T;
        if (st == MHA_OK && save_every && (s + 1) % save_every == 0 && s + 1 < steps) {
            opt.opt.lr = base_lr; /* the checkpoint keeps the peak rate */
            int src = save_checkpoint(out_dir, m, &opt, s + 1, useed, run_id, flags, n_flags,
                                      hist_step, hist_loss, n_hist);
            if (src != CLI_OK) {
                free(tok), free(tgt), free(hist_step), free(hist_loss);
                mha_model_free(m), mha_adamw_free(&opt);
                return src;
            }
        }
        double el = now() - t0;
        if (!quiet && (el - last_print > (tty ? 0.2 : 5.0) || s + 1 == steps)) {
            progress(s + 1, steps, start, loss, tokens_seen / fmax(el, 1e-9), el, tty);
            last_print = el;
        }
    }
    opt.opt.lr = base_lr; /* the checkpoint keeps the peak rate */
    const double train_s = now() - t0;
    if (tty)
        fputc('\n', stderr);
    if (st != MHA_OK) {
        int rc = cli_fail(cmd, st, "training");
        free(tok), free(tgt), free(hist_step), free(hist_loss);
        mha_model_free(m), mha_adamw_free(&opt);
        return rc;
    }

    /* held-out accuracy, checkpoint, loss curve */
    double acc = 0, seq_acc = 0;
    float eval_loss = 0;
    st = evaluate(m, &t, useed, n_eval, batch, &acc, &seq_acc, &eval_loss, out_dir);
    int rc = CLI_OK;
    if (st != MHA_OK)
        rc = cli_fail(cmd, st, "evaluation");
    if (rc == CLI_OK)
        rc = save_checkpoint(out_dir, m, &opt, steps > start ? steps : start, useed, run_id, flags,
                             n_flags, hist_step, hist_loss, n_hist);
    if (rc == CLI_OK) {
        char title[160];
        snprintf(title, sizeof title, "mha train: %s, %lld layers, dim %lld, seed %llu",
                 t.sort ? "sort" : "reverse", (long long)c->layers, (long long)c->dim,
                 (unsigned long long)useed);
        for (int png = 0; rc == CLI_OK && png <= render_png_available(); png++) {
            char err[512];
            snprintf(path, sizeof path, "%s/loss.%s", out_dir, png ? "png" : "svg");
            if (write_curve(path, png, hist_step, hist_loss, n_hist, title, err, sizeof err) != 0) {
                fprintf(stderr, "mha train: %s\n", err);
                rc = CLI_INTERNAL;
            }
        }
    }
    if (rc == CLI_OK) {
        const int64_t done = steps > start ? steps - start : 0;
        printf("steps: %lld\n", (long long)(steps > start ? steps : start));
        printf("train_seconds: %.1f\n", train_s);
        printf("tokens_per_second: %.0f\n", done ? (double)tokens_seen / fmax(train_s, 1e-9) : 0.0);
        printf("eval_loss: %.4f\n", (double)eval_loss);
        printf("sequence_accuracy: %.4f\n", seq_acc);
        printf("checkpoint: %s/model.safetensors\n", out_dir);
        printf("loss_curve: %s/loss.svg", out_dir);
        if (render_png_available())
            printf(" %s/loss.png", out_dir);
        printf("\n");
        printf("accuracy: %.4f\n", acc);
    }
    free(tok), free(tgt), free(hist_step), free(hist_loss);
    mha_model_free(m), mha_adamw_free(&opt);
    return rc;
}
