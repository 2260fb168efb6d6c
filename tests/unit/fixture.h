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

#endif
