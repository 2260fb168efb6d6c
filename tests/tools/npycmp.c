/* npycmp.c - compares two .npy files by the project's rule:
 *     max|y - ref| <= tol * max(1, max|ref|)   (NaN positions must match)
 * usage: npycmp Y.npy REF.npy [TOL=1e-5]
 * Prints "max rel err E (shape ok)"; exit 0 within tol, 1 outside or shape
 * or dtype-kind mismatch, 2 when a file cannot be read. */
#include "mha.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: npycmp Y.npy REF.npy [TOL]\n");
        return 2;
    }
    double tol = argc == 4 ? atof(argv[3]) : 1e-5;
    mha_tensor y, r;
    mha_dtype yd, rd;
    if (mha_npy_load_any(&y, &yd, argv[1], 0) != MHA_OK) {
        fprintf(stderr, "npycmp: %s\n", mha_last_error());
        return 2;
    }
    if (mha_npy_load_any(&r, &rd, argv[2], 0) != MHA_OK) {
        fprintf(stderr, "npycmp: %s\n", mha_last_error());
        mha_tensor_free(&y);
        return 2;
    }
    int rc = 0;
    int64_t n = 1;
    if (y.ndim != r.ndim || yd != rd || y.dtype != MHA_F32) {
        printf("npycmp: rank or dtype differs (%d vs %d dims, dtype %d vs %d)\n", y.ndim, r.ndim,
               (int)yd, (int)rd);
        rc = 1;
    }
    for (int k = 0; rc == 0 && k < y.ndim; k++) {
        if (y.shape[k] != r.shape[k]) {
            printf("npycmp: dim %d is %lld, want %lld\n", k, (long long)y.shape[k],
                   (long long)r.shape[k]);
            rc = 1;
        }
        n *= y.shape[k];
    }
    if (rc == 0) {
        const float *a = y.data, *b = r.data;
        double maxref = 0, maxdiff = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) != isnan(b[i])) {
                maxdiff = INFINITY;
                continue;
            }
            if (isnan(a[i]))
                continue;
            if (fabs((double)b[i]) > maxref)
                maxref = fabs((double)b[i]);
            double d = isinf(a[i]) || isinf(b[i]) ? (a[i] == b[i] ? 0 : INFINITY)
                                                  : fabs((double)a[i] - (double)b[i]);
            if (d > maxdiff)
                maxdiff = d;
        }
        double err = maxdiff / (maxref > 1 ? maxref : 1);
        printf("max rel err %.3g (tol %.3g, %lld elements)\n", err, tol, (long long)n);
        rc = err <= tol ? 0 : 1;
    }
    mha_tensor_free(&y);
    mha_tensor_free(&r);
    return rc;
}
