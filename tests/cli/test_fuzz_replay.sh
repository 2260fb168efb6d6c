#!/bin/sh
# test_fuzz_replay.sh - replays the malformed corpus and the valid test files
# through plain builds of the fuzz targets (crash or sanitizer report = fail).
B=${MHA_BUILD:-build}
pass=0 fail=0
replay() { # replay TARGET FILE-OR-DIR...
    t=$1; shift
    if out=$("$B/fuzz_$t" "$@" 2>&1); then
        n=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9]*\) passed.*/\1/p')
        pass=$((pass + ${n:-0}))
    else
        fail=$((fail + 1))
        printf 'FAIL: fuzz_%s replay\n%s\n' "$t" "$(printf '%s\n' "$out" | tail -20)"
    fi
}
for t in npy safetensors; do
    replay "$t" "tests/corpus/$t" tests/fixtures/io tests/fixtures/cli/*/*."$t"
done
replay tokenizer tests/corpus/tokenizer tests/fixtures/tokenizer/tiny \
    tests/fixtures/tokenizer/tiny_cased tests/fixtures/tokenizer/tiny_ids.txt
echo "fuzz-replay: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
