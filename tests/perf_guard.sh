#!/bin/sh
# perf_guard.sh - a speed guard that does not time: the instructions executed
# inside fixed single-threaded workloads (tests/tools/perf_driver.c), counted
# by valgrind's callgrind (only inside the workload's entry point), compared
# with the counts committed in tests/perf_guard.txt.  A workload that
# executes more than TOLERANCE (default 1.25) times its committed count
# fails, so a change that makes the hot loops do much more work fails even on
# a noisy machine.  One well below its count (< 0.8x) is reported: re-record.
#
#   sh tests/perf_guard.sh            compare (MHA_BUILD=build by default)
#   sh tests/perf_guard.sh --record   rewrite tests/perf_guard.txt
#
# Counts depend on the compiler and flags (gcc 12, -O2, Debian 12 as in CI).
# The projections use the portable GEMM (MHA_GEMM=portable: our code, not
# OpenBLAS's, is counted; OpenBLAS pinned to Haswell anyway); workloads whose kernel this
# build or CPU lacks are skipped.
B=${MHA_BUILD:-build}
TOL=${TOLERANCE:-1.25}
FILE=tests/perf_guard.txt
DRIVER=$B/perf_driver
record=0; [ "${1:-}" = "--record" ] && record=1
pass=0; fail=0
command -v valgrind >/dev/null 2>&1 || { echo "perf guard: valgrind missing"; echo "perf guard: 0 passed, 1 failed"; exit 1; }
[ -x "$DRIVER" ] || { echo "perf guard: $DRIVER not built (make $DRIVER)"; echo "perf guard: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell MHA_GEMM=portable
: > "$T/new"
"$DRIVER" --list | while read -r name toggle; do
    valgrind --tool=callgrind --callgrind-out-file="$T/cg.$name" --toggle-collect="$toggle" \
        "$DRIVER" "$name" >"$T/log.$name" 2>&1
    rc=$?
    if [ $rc -eq 2 ]; then echo "$name skipped" >> "$T/new"; continue; fi
    n=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p; s/^summary: *\([0-9]*\).*/\1/p' "$T/cg.$name" 2>/dev/null | head -n 1)
    if [ $rc -ne 0 ] || [ -z "$n" ]; then echo "$name error" >> "$T/new"; continue; fi
    echo "$name $n" >> "$T/new"
done
if [ $record -eq 1 ]; then
    {
        echo "# instructions (callgrind Ir) inside each perf_driver workload;"
        echo "# written by: sh tests/perf_guard.sh --record   ($(date -u +%Y-%m-%d), $(${CC:-cc} --version | head -n 1))"
        grep -v ' skipped$\| error$' "$T/new"
    } > "$FILE"
    cat "$FILE"
    grep ' error$' "$T/new" && exit 1
    exit 0
fi
while read -r name n; do
    case "$n" in
    skipped) echo "  $name: skipped (kernel not in this build or CPU)"; continue;;
    error) echo "  FAIL $name: the workload failed"; fail=$((fail + 1)); continue;;
    esac
    want=$(awk -v k="$name" '$1 == k { print $2 }' "$FILE")
    if [ -z "$want" ]; then echo "  $name: $n instructions (no committed count)"; continue; fi
    verdict=$(awk -v n="$n" -v w="$want" -v t="$TOL" 'BEGIN {
        r = n / w; printf "%.3f %s", r, (r > t ? "FAIL" : (r < 0.8 ? "LOW" : "ok")) }')
    ratio=${verdict% *}; v=${verdict#* }
    case "$v" in
    FAIL) echo "  FAIL $name: $n instructions = ${ratio}x the committed $want (limit ${TOL}x)"; fail=$((fail + 1));;
    LOW) echo "  $name: $n = ${ratio}x the committed $want: faster, re-record (--record)"; pass=$((pass + 1));;
    *) echo "  $name: $n = ${ratio}x committed"; pass=$((pass + 1));;
    esac
done < "$T/new"
echo "perf guard: $pass passed, $fail failed"
[ $fail -eq 0 ]
