/* cli.h - the `mha` command: one function per subcommand.
 * The CLI is a thin client of include/mha.h: parsing and printing only.
 * Exit codes: 0 success, 2 bad input (arguments, files, shapes), 1 internal
 * failure (out of memory, i/o error while writing). */
#ifndef MHA_CLI_H
#define MHA_CLI_H

#include "mha.h"

#include <stdbool.h>

enum { CLI_OK = 0, CLI_INTERNAL = 1, CLI_BAD_INPUT = 2 };

int cli_demo(int argc, char **argv);
int cli_forward(int argc, char **argv);
int cli_attention(int argc, char **argv);
int cli_bench(int argc, char **argv);
/* `mha bench --decode` (cli/bench_decode.c): op "decode" with gbps. */
int cli_bench_decode(int argc, char **argv);
/* Waits, once per process, until the threads OpenBLAS starts at load have
 * stopped spinning (cli/bench.c), so that timings are of the steady state. */
void cli_bench_settle(void);
/* The median of x (n > 0), sorting x in place (ascending: x[0] is the
 * least); the benchmarks' one median (cli/bench.c). */
double cli_median(double *x, int n);
int cli_viz(int argc, char **argv);
/* `mha grad` (cli/grad.c); `mha grad --layer ...` goes to cli_grad_layer
 * (cli/grad_layer.c). */
int cli_grad(int argc, char **argv);
int cli_grad_layer(int argc, char **argv);
/* `mha train` (cli/train.c). */
int cli_train(int argc, char **argv);
/* `mha tokenize` (cli/tokenize.c). */
int cli_tokenize(int argc, char **argv);

/* Writes the seed example's per-head attention maps (+ average) to svg_path
 * and png_path (either may be NULL; the PNG is skipped with a note when the
 * build has no libpng) and prints "mha demo: wrote PATH (...)" per file.
 * Returns CLI_OK / CLI_INTERNAL (viz.c). */
int cli_viz_write_demo_maps(const char *svg_path, const char *png_path);
/* `mha forward --layer encoder|decoder ...` (cli/forward_layer.c); cli_forward
 * hands the whole argument vector over when --layer is present. */
int cli_forward_layer(int argc, char **argv);

/* The Transformer-block section of `mha demo` (cli/demo_block.c). */
int cli_demo_block(void);
/* `mha embed` and `mha search` (cli/embed.c, on cli/embedder.h). */
int cli_embed(int argc, char **argv);
int cli_search(int argc, char **argv);
/* `mha viz --model ...` (cli/viz_model.c); cli_viz hands over when --model
 * is present. */
int cli_viz_model(int argc, char **argv);
/* Draws w (H,L,S) to svg / png (either may be NULL), says where on stdout
 * (cli/viz.c); png_optional: skip the PNG with a note without libpng. */
int cli_viz_write_maps(const char *cmd, const float *w, int64_t H, int64_t L, int64_t S,
                       const char *const *qlabels, const char *const *klabels,
                       const char *title, float vmax, const char *svg, const char *png,
                       int png_optional);
/* The trained-model section of `mha demo` (cli/demo_model.c). */
int cli_demo_model(void);
/* The one number parser of every flag (number.c): strict decimal, the whole
 * string, no spaces or hex, and no overflow or underflow (ERANGE).  False
 * when s is NULL, malformed or out of [lo, hi] / range; *out untouched. */
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_f64(const char *s, double *out);
/* "a,b,c": up to max integers in [lo, hi]; the count, or -1. */
int cli_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max);
bool cli_parse_f32(const char *s, float *out);
/* --dtype f32|f16|bf16 (number.c): the storage of a computation.  Parse, name
 * ("f32", "f16", "bf16"), and the option form: CLI_OK, or "mha CMD: OPT: 'S'
 * is not a dtype (valid: f32, f16, bf16)" and CLI_BAD_INPUT. */
#define CLI_DTYPES "f32, f16, bf16"
bool cli_parse_dtype(const char *s, mha_dtype *out);
const char *cli_dtype_name(mha_dtype dt);
int cli_dtype_option(const char *cmd, const char *opt, const char *s, mha_dtype *out);
/* The kernel named s by mha_kernel_name ("auto" 0, "ref" .. "avx512"), or -1. */
int cli_kernel_named(const char *s);
/* Conversions for --dtype (dtype.c), through mha_tensor_convert.  The
 * tensors are owned; on failure nothing changes and the status is returned. */
/* *t replaced by its conversion to dt (a no-op when t is already dt). */
mha_status cli_tensor_to_dtype(mha_tensor *t, mha_dtype dt);
/* *rounded (new, owned, MHA_F32) = src rounded to dt once, back in float32. */
mha_status cli_tensor_rounded(mha_tensor *rounded, const mha_tensor *src, mha_dtype dt);

/* Maps a library status to an exit code and prints "mha CMD: msg" to stderr. */
int cli_fail(const char *cmd, mha_status st, const char *context);

#endif
