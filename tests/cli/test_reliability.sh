#!/bin/sh
# test_reliability.sh - the CLI under failure injection and fuzz replay.
#  1. Allocation failures: every committed CLI case (tests/fixtures/cli/*/args,
#     plus --attn-weights-out) runs with MHA_TEST_FAIL_ALLOC=k (the library's
#     test hook, src/alloc.c: the k-th allocation fails) and =k+ (it and all
#     later ones fail) for k = 1, 2, ... until the command succeeds.  Each
#     failing run must exit 1 (internal failure) with a message on stderr,
#     not crash, and leave no output file.  The hook exists only in the test
#     build's CLI, $B/test/mha; every case must hit at least one point.
#  2. The argument fuzz target replays its corpus (tests/corpus/cli_args).
B=${MHA_BUILD:-build}
MHA=$PWD/$B/test/mha
pass=0; fail=0; points=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "  FAIL: $1"; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

oom_case() { # dir, extra args...
    d=$1; shift
    for mode in "" "+"; do
        k=1
        while [ $k -le 500 ]; do
            rm -f "$T/y.npy" "$T/a.npy"
            # shellcheck disable=SC2046
            (cd "$d" && MHA_TEST_FAIL_ALLOC="$k$mode" "$MHA" $(cat args) --out "$T/y.npy" "$@") \
                >/dev/null 2>"$T/stderr"
            rc=$?
            [ $rc -eq 0 ] && break
            points=$((points + 1))
            if [ $rc -ne 1 ] || ! [ -s "$T/stderr" ]; then
                ko "$(basename "$d") MHA_TEST_FAIL_ALLOC=$k$mode: exit $rc, $(head -c 200 "$T/stderr")"
                break
            elif [ -e "$T/y.npy" ]; then
                ko "$(basename "$d") MHA_TEST_FAIL_ALLOC=$k$mode: left $T/y.npy behind"
                break
            else ok; fi
            k=$((k + 1))
        done
        if [ $rc -eq 0 ] && [ -s "$T/y.npy" ]; then ok
        else ko "$(basename "$d"): never succeeded (mode '$mode', k $k)"; fi
        if [ "$k" -gt 1 ]; then ok
        else ko "$(basename "$d"): no injection point hit (mode '$mode'): has $MHA the hook?"; fi
    done
}

for d in tests/fixtures/cli/*/; do
    [ -f "$d/args" ] || continue
    extra=""
    case "$(head -c 7 "$d/args")" in forward) extra="--attn-weights-out $T/a.npy";; esac
    # shellcheck disable=SC2086
    oom_case "$d" $extra
done
echo "cli oom: $points injection points"

# ---- fuzz corpus replay ------------------------------------------------------------
if out=$("$B/fuzz_cli_args" tests/corpus/cli_args 2>&1); then
    n=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9]*\) passed.*/\1/p')
    pass=$((pass + ${n:-0}))
else
    ko "fuzz_cli_args replay: $(printf '%s\n' "$out" | tail -20)"
fi

echo "reliability cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
