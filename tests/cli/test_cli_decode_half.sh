#!/bin/sh
# test_cli_decode_half.sh - `mha bench --decode --dtype bf16|f16|f32`: the
# JSON line names the cache's dtype and the read bandwidth, each kernel is
# validated against the reference decode (exit 0); a bad --dtype is refused.
. tests/cli/lib/common.sh
for dt in bf16 f16 f32; do
    for k in auto scalar ref; do
        if "$MHA" bench --decode --kv-seq 300,600 --heads 6 --kv-heads 2 --head-dim 24 --reps 1 \
            --kernel $k --dtype $dt --json >"$T/out" 2>"$T/err" &&
            [ "$(grep -c "^{\"op\":\"decode\",\"kernel\":\"[a-z0-9]*\",\"dtype\":\"$dt\".*\"read_gbps\":[0-9.]*,\"bw_frac\":[0-9.]*,\"max_err\"" "$T/out")" -eq 2 ]
        then ok
        else ko "bench --decode --dtype $dt --kernel $k: $(cat "$T/out" "$T/err")"; fi
    done
done
# ms the median of the steps, ms_min the fastest, bw_frac each step's rate
# over the read pass before it (a median over the pairs)
"$MHA" bench --decode --kv-seq 300 --heads 6 --kv-heads 2 --head-dim 24 --reps 5 --json \
    >"$T/out" 2>"$T/err"
sed -n 's/.*"ms":\([0-9.]*\),"ms_min":\([0-9.]*\),.*"bw_frac":\([0-9.]*\),.*/\1 \2 \3/p' "$T/out" |
    awk '{ exit !(NF == 3 && $2 > 0 && $2 <= $1 && $3 > 0) }' && ok ||
    ko "decode ms_min/bw_frac: $(cat "$T/out" "$T/err")"
"$MHA" bench --decode --dtype f64 >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "dtype: 'f64' is not f32, bf16 or f16" "$T/err" && [ ! -s "$T/out" ] && ok ||
    ko "--dtype f64 accepted: $(cat "$T/err")"
"$MHA" bench --decode --dtype >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && grep -q "needs a value" "$T/err" && ok || ko "--dtype without a value accepted"
echo "cli-decode-half: $pass passed, $fail failed"
[ $fail -eq 0 ]
