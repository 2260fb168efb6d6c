/* fixture.h - reading the PyTorch parity fixtures (tests/fixtures/<set>/<case>/).
 * Each case holds config.txt (key=value lines) and .npy arrays. */
#ifndef MHA_TEST_FIXTURE_H
#define MHA_TEST_FIXTURE_H

#include "test.h"

#define FIXTURE_MAX_KEYS 64

typedef struct fixture {
    char dir[512];
    char keys[FIXTURE_MAX_KEYS][32];
    char values[FIXTURE_MAX_KEYS][64];
    int n;
} fixture;

/* Lists case directories of a set, sorted; returns the count (<= max). */
int fixture_list(const char *set, char names[][128], int max);

/* Opens case `name` of `set`: reads config.txt.  false on failure. */
bool fixture_open(fixture *f, const char *set, const char *name);

/* A config value ("" when absent), as text or integer. */
const char *fixture_str(const fixture *f, const char *key);
int64_t fixture_int(const fixture *f, const char *key);

/* True when DIR/file exists. */
bool fixture_has(const fixture *f, const char *file);

/* Loads DIR/file as `want` (MHA_F32 or MHA_BOOL) or as the file's own kind
 * (want < 0: bool files -> MHA_BOOL, floats -> MHA_F32). */
mha_status fixture_load(const fixture *f, const char *file, int want, mha_tensor *t);

/* Elements of t (its shape's product). */
size_t fixture_numel(const mha_tensor *t);

/* Checks y (as many floats as ref) against ref by the rule
 * max|y - ref| <= tol * max(1, max|ref|), NaN only where ref has NaN;
 * fails the test naming the case and tensor; raises *worst. */
void fixture_compare(const char *case_name, const char *what, const float *y,
                     const mha_tensor *ref, double tol, double *worst);

/* Loads DIR/file when the case has it; NULL when it does not (or when the
 * load fails, which fails the test). */
const mha_tensor *fixture_optional(const fixture *f, const char *file, int want, mha_tensor *t);

/* The causal mode a config names: none | top_left | bottom_right | offset. */
mha_causal fixture_causal(const fixture *f, const char *key);

/* The next entry of a malformed-corpus table (tests/corpus/NAME.txt lines
 * "FILE STATUS message-substring"; '#' lines and blank ones skipped):
 * file (96 bytes), the status named (FORMAT, OVERFLOW, UNSUPPORTED, IO,
 * DTYPE, SHAPE; -1 for another word or a line that does not parse, with
 * file "") and *needle pointing into line (1024 bytes).  False at the end. */
bool fixture_corpus_next(FILE *f, char *line, char *file, int *status, const char **needle);

#endif
