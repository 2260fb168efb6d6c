/* seeds.h - the seed tutorials' example and claims, computed live.
 *
 * The seeds (../shared/seeds) walk multi-head attention on L=7 tokens
 * "远方有颗苹果树", D=8, h=2, and make claims about it.  This module builds
 * that example with mha's seeded RNG and measures each claim with the
 * public API; `mha demo` prints the results and the unit tests assert them.
 */
#ifndef MHA_SEEDS_H
#define MHA_SEEDS_H

#include "mha.h"

/* The example: X (L,D), in_proj (3D,D) rows q|k|v, out_proj (D,D); no biases,
 * as in the seed's NumPy code. */
typedef struct seed_example {
    int64_t L, D, h;
    float *x, *in_proj, *out_proj; /* one allocation, owned */
} seed_example;

int seed_example_make(seed_example *ex, int64_t L, int64_t D, int64_t h, uint64_t seed);
void seed_example_free(seed_example *ex);

/* Runs nn.MultiheadAttention on the example: out (L,D) and per-head
 * weights (h,L,L) (either may be NULL). */
mha_status seed_example_forward(const seed_example *ex, float *out, float *weights);

typedef struct seed_claim {
    const char *statement; /* the seed's claim, in English                    */
    const char *measure;   /* what `measured` is                              */
    double measured;
    double bound;
    int at_least;          /* 1: holds when measured >= bound; 0: <= bound    */
    int holds;
} seed_claim;

#define SEED_CLAIMS_MAX 12

/* Measures every claim on an example of the given size; returns the count,
 * or -1 on failure (mha_last_error() says why). */
int seed_claims_check(seed_claim *claims, int64_t L, int64_t D, int64_t h, uint64_t seed);

#endif

/* The seed 003 walkthrough, step by step, with every intermediate:
 * q/k/v (L,D) projections, heads (h,L,d) per-head outputs, attn_weights (h,L,L),
 * concat (L,D), out (L,D); err_vs_api = max rel error of out against
 * mha_multihead_forward on the same example. */
typedef struct seed_walk {
    float *q, *k, *v, *heads, *attn_weights, *concat, *out; /* one allocation */
    double err_vs_api;
} seed_walk;

int seed_walk_run(const seed_example *ex, seed_walk *walk);
void seed_walk_free(seed_walk *walk);
