#!/bin/sh
# test_abi.sh - what the released library and CLI expose (issues 12, 13):
#  * libmha.so exports only functions declared in include/mha.h: no mha_test_*
#    hook, no internal or bench-only function (mha_peak_gflops);
#  * libmha.a and the release mha carry no test hook: MHA_TEST_FAIL_ALLOC has
#    no effect on them (the hooks live in $B/test/, docs/errors.md);
#  * the test build's CLI does react to it (so the check above can fail).
# The coverage build (MHA_COVERAGE=1) is a test build throughout: the hook
# checks are skipped there.
B=${MHA_BUILD:-build}
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "  FAIL: $1"; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# every exported function is declared in the public header
nm -D --defined-only "$B/libmha.so" | awk '$2 == "T" || $2 == "W" {print $3}' >"$T/exported"
if [ -s "$T/exported" ]; then ok; else ko "nm -D $B/libmha.so lists no function"; fi
while read -r sym; do
    # the coverage build's hooks, and libgcov's own helper (gcc links it into the .so)
    case "${MHA_COVERAGE:-0}:$sym" in 1:mha_test_* | 1:mangle_path | 1:__gcov_*) continue;; esac
    if grep -Eq "[ *]$sym\(" include/mha.h; then ok; else ko "libmha.so exports $sym, not in include/mha.h"; fi
done <"$T/exported"
if grep -q mha_peak_gflops "$T/exported"; then ko "libmha.so exports mha_peak_gflops"; else ok; fi

case_dir=tests/fixtures/cli/fwd_masked_rows_zero
run_with_hook() { # cli -> exit status under MHA_TEST_FAIL_ALLOC=1+
    # shellcheck disable=SC2046
    (cd "$case_dir" && MHA_TEST_FAIL_ALLOC=1+ "$1" $(cat args) --out "$T/y.npy") >/dev/null \
        2>"$T/hook.err"
}
if [ "${MHA_COVERAGE:-0}" = 1 ]; then
    echo "  skipped: hook checks (the coverage build has the hooks in every binary)"
    skip=$((skip + 4))
else
    if nm "$B/libmha.a" "$B/mha" 2>/dev/null | grep -q ' mha_test_'; then
        ko "libmha.a or mha defines mha_test_* symbols"
    else ok; fi
    if grep -q MHA_TEST_FAIL_ALLOC "$B/mha"; then ko "$B/mha reads MHA_TEST_FAIL_ALLOC"; else ok; fi
    if run_with_hook "$PWD/$B/mha"; then ok; else
        ko "release mha fails under MHA_TEST_FAIL_ALLOC=1+ (exit $?): $(tail -n 8 "$T/hook.err")"
    fi
    if run_with_hook "$PWD/$B/test/mha"; then ko "test mha ignores MHA_TEST_FAIL_ALLOC=1+"; else ok; fi
fi
echo "abi: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
