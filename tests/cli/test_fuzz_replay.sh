#!/bin/sh
# test_fuzz_replay.sh - replays the malformed corpus and the valid test files
# through plain builds of the fuzz targets (crash or sanitizer report = fail).
B=${MHA_BUILD:-build}
pass=0 fail=0
for t in npy safetensors; do
    if out=$("$B/fuzz_$t" "tests/corpus/$t" tests/fixtures/io tests/fixtures/cli/*/*."$t" 2>&1); then
        n=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9]*\) passed.*/\1/p')
        pass=$((pass + ${n:-0}))
    else
        fail=$((fail + 1))
        printf 'FAIL: fuzz_%s replay\n%s\n' "$t" "$(printf '%s\n' "$out" | tail -20)"
    fi
done
echo "fuzz-replay: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
