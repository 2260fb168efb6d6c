#!/bin/sh
# test_cli_bench.sh - `mha bench`: JSON fields, validation of every kernel,
# --mha, --backward (attention_bwd, mha_bwd), argument errors (exit 2).  Tiny shapes only: this is not a timing.
B=${MHA_BUILD:-build}
MHA=$B/mha
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*"; }

"$MHA" bench --batch 2 --heads 4 --kv-heads 2 --seq 37 --kv-seq 53 --head-dim 24 \
    --causal --threads 2 --kernel all --reps 1 --json >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && ok || ko "bench all kernels: $(cat "$T/err")"
n=$(grep -c '^{"op":"attention"' "$T/out")
[ "$n" -ge 2 ] && ok || ko "want a JSON line per kernel, got $n"
for f in op kernel B H Hkv L S d causal threads ms ms_min gflops peak_gflops max_err; do
    grep -q "\"$f\":" "$T/out" && ok || ko "field $f missing"
done
sed -n 's/.*"ms":\([0-9.]*\),"ms_min":\([0-9.]*\),.*/\1 \2/p' "$T/out" |
    awk '$2 > $1 || $2 <= 0 { bad = 1 } END { exit bad || NR < 2 }' && ok ||
    ko "ms_min not the fastest of the runs: $(head -1 "$T/out")"
grep -q '"causal":true' "$T/out" && grep -q '"Hkv":2' "$T/out" && grep -q '"threads":2' "$T/out" \
    && ok || ko "values: $(head -1 "$T/out")"
grep -q '"kernel":"ref"' "$T/out" && grep -q '"kernel":"scalar"' "$T/out" && ok || ko "kernels"

"$MHA" bench --batch 1 --heads 2 --seq 20 --head-dim 8 --mha --reps 1 --json >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && grep -q '^{"op":"mha"' "$T/out" && ok || ko "--mha: $(cat "$T/err")"

# --backward: attention_bwd per kernel (validated against the reference
# backward first), then mha_bwd; fields of the ratio to the forward
"$MHA" bench --backward --batch 2 --heads 4 --kv-heads 2 --seq 37 --kv-seq 53 --head-dim 24 \
    --causal --threads 2 --kernel all --reps 1 --json >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && ok || ko "bench --backward all kernels: $(cat "$T/err")"
n=$(grep -c '^{"op":"attention_bwd"' "$T/out")
[ "$n" -ge 2 ] && ok || ko "want an attention_bwd line per kernel, got $n"
for f in ms fwd_ms ratio gflops max_err; do
    grep -q "\"$f\":" "$T/out" && ok || ko "backward field $f missing"
done
grep -q '"kernel":"ref"' "$T/out" && grep -q '"kernel":"scalar"' "$T/out" && ok || ko "bwd kernels"
grep -q '"max_err":null' "$T/out" && ko "attention_bwd must be validated" || ok
"$MHA" bench --backward --batch 1 --heads 2 --seq 20 --head-dim 8 >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && grep -q '^attention_bwd .* ratio ' "$T/out" && ok || ko "bwd text: $(cat "$T/err")"
"$MHA" bench --backward --mha --batch 1 --heads 2 --seq 20 --head-dim 8 --reps 1 --json \
    >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && grep -q '^{"op":"mha_bwd"' "$T/out" && grep -q '"ratio":' "$T/out" \
    && ! grep -q '"max_err":null' "$T/out" && ok || ko "--backward --mha: $(cat "$T/err")"

"$MHA" bench --heads 3 --kv-heads 2 --seq 8 --head-dim 4 2>"$T/err"
[ $? -eq 2 ] && grep -q "does not divide" "$T/err" && ok || ko "kv-heads must divide heads"
"$MHA" bench --seq -4 2>"$T/err"
[ $? -eq 2 ] && grep -q -- "--seq" "$T/err" && ok || ko "negative --seq"
"$MHA" bench --kernel fast --seq 8 2>"$T/err"
[ $? -eq 2 ] && grep -q "not ref, scalar" "$T/err" && ok || ko "bad --kernel"
"$MHA" bench --bogus 2>"$T/err"
[ $? -eq 2 ] && ok || ko "unknown option"
"$MHA" bench --help >"$T/out" && grep -q -- "--kv-heads" "$T/out" && ok || ko "--help"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
