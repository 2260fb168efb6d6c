#!/bin/sh
# Runs every suite and sums their "N passed, N failed[, N skipped]" lines
# into "N passed, N failed, N skipped".  A suite whose result line has no
# skipped count contributes one skip per output line that says "skipped".
# MHA_BUILD names the build directory (build, build-san, ...).
B=${MHA_BUILD:-build}
# LLVM libomp's per-thread bookkeeping is not ours (tests/lsan.supp).
LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp}; export LSAN_OPTIONS
total_pass=0; total_fail=0; total_skip=0; status=0
run_suite() {
    name=$1; shift
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v '^ok ' | tail -n 40
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p')
    f=$(printf '%s' "$line" | sed -n 's/.* \([0-9][0-9]*\) failed.*/\1/p')
    k=$(printf '%s' "$line" | sed -n 's/.* \([0-9][0-9]*\) skipped.*/\1/p')
    [ -z "$k" ] && k=$(printf '%s\n' "$out" | grep -c 'skipped')
    if [ -z "$p" ]; then echo "suite $name: no result line (exit $rc)"; p=0; f=1; fi
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + k))
    [ "$f" -ne 0 ] && status=1
}
run_suite unit "$B/mha-tests"
for s in tests/cli/*.sh; do
    [ -f "$s" ] && run_suite "$(basename "$s" .sh)" env MHA_BUILD="$B" sh "$s"
done
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
