/* number.c - the one number parser of every `mha` flag.
 *
 * Strict decimal: an optional sign, digits, for reals an optional fraction
 * and exponent; nothing before or after (no spaces), no hex ("0x1p-3"), no
 * "inf"/"nan", and no value that overflows or underflows (strtod's ERANGE:
 * "1e-400" is an error, not 0; for float flags also a value float cannot
 * hold: "1e39", "1e-46").  Also the one parser of --dtype f32|f16|bf16.
 */
#include "cli.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the run of decimal digits at s. */
static size_t digits(const char *s) {
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    return n;
}

/* True when s is [+-]digits, or with real: [+-](digits[.digits*]|.digits)([eE][+-]digits)? */
static bool decimal_syntax(const char *s, bool real) {
    const char *p = s + (*s == '+' || *s == '-');
    size_t whole = digits(p);
    p += whole;
    if (!real)
        return whole > 0 && *p == 0;
    size_t frac = 0;
    if (*p == '.') {
        frac = digits(p + 1);
        p += 1 + frac;
    }
    if (whole + frac == 0)
        return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        p += *p == '+' || *p == '-';
        size_t ex = digits(p);
        if (!ex)
            return false;
        p += ex;
    }
    return *p == 0;
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !decimal_syntax(s, false))
        return false;
    errno = 0;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return false;
    *out = (int64_t)x;
    return true;
}

int cli_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max) {
    int n = 0;
    if (!s)
        return -1;
    for (const char *p = s;; p++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (n == max || len == 0 || len >= sizeof item)
            return -1;
        memcpy(item, p, len);
        item[len] = 0;
        if (!cli_parse_i64(item, lo, hi, &out[n]))
            return -1;
        n++;
        if (!comma)
            return n;
        p = comma;
    }
}

bool cli_parse_f64(const char *s, double *out) {
    if (!s || !decimal_syntax(s, true))
        return false;
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (errno == ERANGE || *end || !isfinite(x))
        return false;
    *out = x;
    return true;
}

bool cli_parse_f32(const char *s, float *out) {
    double x;
    if (!cli_parse_f64(s, &x))
        return false;
    float f = (float)x;
    if (!isfinite(f) || (x != 0.0 && fabs(x) < FLT_MIN))
        return false; /* overflows float, or underflows to a subnormal/zero */
    *out = f;
    return true;
}

/* --dtype: the three storage names, in the order the error message lists them. */
static const struct {
    const char *name;
    mha_dtype dtype;
} dtype_names[] = {{"f32", MHA_F32}, {"f16", MHA_F16}, {"bf16", MHA_BF16}};

bool cli_parse_dtype(const char *s, mha_dtype *out) {
    for (size_t i = 0; s && i < sizeof dtype_names / sizeof *dtype_names; i++)
        if (!strcmp(s, dtype_names[i].name)) {
            *out = dtype_names[i].dtype;
            return true;
        }
    return false;
}

const char *cli_dtype_name(mha_dtype dt) {
    for (size_t i = 0; i < sizeof dtype_names / sizeof *dtype_names; i++)
        if (dtype_names[i].dtype == dt)
            return dtype_names[i].name;
    return "?";
}

int cli_dtype_option(const char *cmd, const char *opt, const char *s, mha_dtype *out) {
    if (cli_parse_dtype(s, out))
        return CLI_OK;
    fprintf(stderr, "mha %s: %s: '%s' is not a dtype (valid: %s)\n", cmd, opt, s ? s : "",
            CLI_DTYPES);
    return CLI_BAD_INPUT;
}

int cli_kernel_named(const char *s) {
    for (int k = MHA_KERNEL_AUTO; k <= MHA_KERNEL_AVX512; k++)
        if (s && !strcmp(s, mha_kernel_name((mha_kernel)k)))
            return k;
    return -1;
}
