#!/bin/sh
# gemm.sh - GFLOP/s of the projection GEMM paths on the MHA shapes, one run.
#
#   bench/gemm.sh [threads]     (default 2; MHA_BUILD picks the build dir)
#
# Shapes: the fused QKV projection (M = L, N = 3E, K = E) and the output
# projection (M = L, N = K = E) at E = 512.  Paths: mha's avx2 kernel, the
# portable loop, OpenBLAS under the core it detects, and OpenBLAS forced to
# its Haswell kernels with OPENBLAS_CORETYPE=Haswell (set here, for this
# comparison only; the library never sets OPENBLAS_* variables).
set -eu
T=${1:-2}
B=${MHA_BUILD:-build}
BIN="$B/gemm_bench"
make -s --no-print-directory BUILD="$B" "$BIN"   # `make bench` builds every bench/*.c
export OMP_NUM_THREADS="$T" OPENBLAS_NUM_THREADS="$T"
for shape in "2048 1536 512" "2048 512 512"; do
    # shellcheck disable=SC2086
    for rep in 1 2 3; do
        "$BIN" avx2 $shape 7
        "$BIN" blas $shape 7
        OPENBLAS_CORETYPE=Haswell "$BIN" blas $shape 7
    done
    "$BIN" portable $shape 3
done
