#!/bin/sh
# test_cli_decode.sh - `mha bench --decode`: op "decode" lines with gbps,
# validated against the reference decode (exit 0), and its argument errors.
. tests/cli/lib/common.sh
for k in auto scalar ref; do
    if "$MHA" bench --decode --kv-seq 300,600 --heads 6 --kv-heads 2 --head-dim 24 --reps 1 \
        --kernel $k --json >"$T/out" 2>"$T/err" &&
        [ "$(grep -c '^{"op":"decode".*"gbps":[0-9.]*,.*"max_err"' "$T/out")" -eq 2 ]; then ok
    else ko "bench --decode --kernel $k: $(cat "$T/out" "$T/err")"; fi
done
"$MHA" bench --decode --kv-seq 0 >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "kv-seq" "$T/err" && ok || ko "--kv-seq 0 accepted"
"$MHA" bench --decode --kernel fast >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "kernel" "$T/err" && ok || ko "--kernel fast accepted"
"$MHA" bench --decode --heads 5 --kv-heads 2 --kv-seq 10 >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "multiple" "$T/err" && ok || ko "5 heads over 2 kv heads accepted"
echo "cli-decode: $pass passed, $fail failed"
[ $fail -eq 0 ]
