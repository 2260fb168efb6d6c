#!/bin/sh
# valgrind.sh - a quick subset of the suite under valgrind memcheck, one
# thread (OMP_NUM_THREADS=1), with libgomp/OpenBLAS suppressions
# (tests/valgrind.supp).  Any memcheck error or definite leak fails.
# The subset: the bad-input matrix, allocation and I/O failure injection on
# tensors/SDPA/files, the core semantics tests, the file readers, and the
# fuzz targets' corpus replays.  About a minute on the CI machine.
B=${MHA_BUILD:-build}
pass=0; fail=0
VG="valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --suppressions=tests/valgrind.supp -q"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
run() { # name, command...
    name=$1; shift
    # shellcheck disable=SC2086
    $VG "$@" >"$T/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "  FAIL valgrind $name (exit $rc):"; grep -v '^ok ' "$T/out" | tail -40; fi
}
for f in bad_input oom_tensor oom_sdpa io_faults core npy safetensors; do
    run "mha-tests $f" "$B/mha-tests" "$f"
done
run fuzz_npy "$B/fuzz_npy" tests/corpus/npy
run fuzz_safetensors "$B/fuzz_safetensors" tests/corpus/safetensors
run fuzz_cli_args "$B/fuzz_cli_args" tests/corpus/cli_args
echo "valgrind: $pass passed, $fail failed"
[ $fail -eq 0 ]
