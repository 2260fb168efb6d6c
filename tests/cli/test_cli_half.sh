#!/bin/sh
# test_cli_half.sh - `--dtype f32|f16|bf16` of `mha attention`, `mha forward`
# and `mha bench`, and half .npy files on the command line (<f2 float16, <u2
# raw bfloat16 bits).  References (tests/fixtures/half, gen_half_fixtures.py):
# float64 attention from the rounded q, k, v with P rounded to v's dtype
# before P.V; torch nn.MultiheadAttention in float64 on the rounded inputs
# and weights.  Each half check is paired with one showing the float32 path
# is further from that reference than the tolerance (so it can fail).
# Prints "cli-half: N passed, N failed".
. tests/cli/lib/common.sh
CMP=$PWD/$B/npycmp
H=tests/fixtures/half
QKV="--q $H/attn_q.npy --k $H/attn_k.npy --v $H/attn_v.npy"
QKV_BF16="--q $H/attn_q_bf16.npy --k $H/attn_k_bf16.npy --v $H/attn_v_bf16.npy"
FWD="--weights $H/fwd_w.safetensors --heads 3 --query $H/fwd_q.npy"

# close Y REF TOL what: npycmp within TOL (same shape and file dtype)
close() {
    if "$CMP" "$1" "$2" "$3" >"$T/cmp" 2>&1; then ok; else ko "$4: $(cat "$T/cmp")"; fi
}
# far Y REF TOL what: outside TOL (the check above would catch a missing rounding)
far() {
    "$CMP" "$1" "$2" "$3" >"$T/cmp" 2>&1
    if [ $? -eq 1 ]; then ok; else ko "$4: within $3 of the half reference: $(cat "$T/cmp")"; fi
}
# descr Y WANT: the .npy header's descr
descr() {
    if head -c 64 "$1" | grep -qF "'descr': '$2'"; then ok
    else ko "$1: descr is not $2: $(head -c 60 "$1" | tr -cd '[:print:]')"; fi
}
run() { # run what CMD...: exit 0 or a failure naming what
    w=$1
    shift
    if "$@" >"$T/stdout" 2>"$T/stderr" </dev/null; then ok; else ko "$w: exit $?: $(cat "$T/stderr")"; fi
}

# ---- help and bad values -------------------------------------------------------
for c in attention forward bench; do
    if "$MHA" $c --help 2>&1 | grep -q -- "--dtype"; then ok; else ko "mha $c --help lacks --dtype"; fi
    expect 2 "'fp8' is not a dtype (valid: f32, f16, bf16)" "$MHA" $c --dtype fp8
done
# shellcheck disable=SC2086
expect 2 "--dtype: 'BF16' is not a dtype" "$MHA" attention $QKV --dtype BF16 --out "$T/y.npy"
expect 2 "--dtype needs a value" "$MHA" attention --dtype
expect 2 "--dtype needs a value" "$MHA" bench --dtype
expect 2 "attention forward only" "$MHA" bench --dtype bf16 --mha --heads 2 --seq 8 --head-dim 4
expect 2 "attention forward only" "$MHA" bench --dtype f16 --backward --heads 2 --seq 8 --head-dim 4
# ONNX: Q and K of one float dtype
expect 2 "must have one float dtype" "$MHA" attention --q $H/attn_q.npy --k $H/attn_k_bf16.npy \
    --v $H/attn_v.npy --out "$T/y.npy"

# ---- mha attention --dtype on float32 files: float32 output ----------------------
# measured: 1.8e-7 (bf16), 2.7e-7 (f16) on the ref, scalar and avx2 kernels;
# the float32 path is 5.2e-3 / 4.7e-4 away
for dt in bf16 f16; do
    tol=1e-3
    [ $dt = f16 ] && tol=2e-4
    # shellcheck disable=SC2086
    run "attention --dtype $dt" "$MHA" attention $QKV --dtype $dt --out "$T/y_$dt.npy"
    close "$T/y_$dt.npy" $H/attn_out_dtype_$dt.npy $tol "attention --dtype $dt"
    descr "$T/y_$dt.npy" "<f4"
    # the same on each kernel the machine runs
    for k in ref scalar; do
        # shellcheck disable=SC2086
        run "attention --dtype $dt ($k)" env MHA_KERNEL=$k "$MHA" attention $QKV --dtype $dt \
            --out "$T/yk.npy"
        close "$T/yk.npy" $H/attn_out_dtype_$dt.npy $tol "attention --dtype $dt, MHA_KERNEL=$k"
    done
done
# shellcheck disable=SC2086
run "attention --dtype f32" "$MHA" attention $QKV --dtype f32 --out "$T/y32.npy"
far "$T/y32.npy" $H/attn_out_dtype_bf16.npy 1e-3 "attention --dtype f32"
far "$T/y32.npy" $H/attn_out_dtype_f16.npy 2e-4 "attention --dtype f32"
# shellcheck disable=SC2086
run "attention (no --dtype)" "$MHA" attention $QKV --out "$T/y0.npy"
if cmp -s "$T/y0.npy" "$T/y32.npy"; then ok; else ko "--dtype f32 is not the default"; fi

# ---- bfloat16 (<u2) and float16 (<f2) files: output in the input's dtype ---------
# shellcheck disable=SC2086
run "attention on bf16 files" "$MHA" attention $QKV_BF16 --out "$T/yb.npy"
descr "$T/yb.npy" "<u2"
close "$T/yb.npy" $H/attn_out_bf16_files.npy 8e-3 "attention on bf16 files" # 1 bf16 ulp
# shellcheck disable=SC2086
run "attention on bf16 files --dtype bf16" "$MHA" attention $QKV_BF16 --dtype bf16 \
    --out "$T/ybb.npy"
descr "$T/ybb.npy" "<u2"
close "$T/ybb.npy" $H/attn_out_bf16_files_dtype_bf16.npy 8e-3 "bf16 files --dtype bf16"
# pasts: present = concat(past, new) is exact in bf16 storage, the same bits
# from the float32 and the bf16 paths; Y of the two within one bf16 ulp
PAST="--past-key $H/attn_k_bf16.npy --past-value $H/attn_v_bf16.npy"
for dt in f32 bf16; do
    # shellcheck disable=SC2086
    run "attention with pasts --dtype $dt" "$MHA" attention $QKV_BF16 $PAST --causal --dtype $dt \
        --out "$T/yp_$dt.npy" --present-key "$T/pk_$dt.npy" --present-value "$T/pv_$dt.npy"
    descr "$T/pk_$dt.npy" "<u2"
done
if cmp -s "$T/pk_f32.npy" "$T/pk_bf16.npy" && cmp -s "$T/pv_f32.npy" "$T/pv_bf16.npy"; then ok
else ko "attention: presents differ between --dtype f32 and bf16"; fi
close "$T/yp_bf16.npy" "$T/yp_f32.npy" 8e-3 "attention with pasts, bf16 vs f32 compute"
if head -c 200 "$T/pk_bf16.npy" | grep -qF "'shape': (2, 2, 18, 8)"; then ok
else ko "present_key shape: $(head -c 90 "$T/pk_bf16.npy" | tr -cd '[:print:]')"; fi
run "attention on f16 files --dtype bf16" "$MHA" attention --q $H/attn_q_f16.npy \
    --k $H/attn_k_f16.npy --v $H/attn_v_f16.npy --dtype bf16 --out "$T/yh.npy"
descr "$T/yh.npy" "<f2"

# ---- mha forward --dtype: inputs and weights rounded, float32 compute ------------
# measured 1.2e-7 (bf16), 1.1e-7 (f16) from torch; the float32 path is 3.2e-3 away
# shellcheck disable=SC2086
run "forward" "$MHA" forward $FWD --out "$T/f32.npy"
for dt in bf16 f16; do
    # shellcheck disable=SC2086
    run "forward --dtype $dt" "$MHA" forward $FWD --dtype $dt --out "$T/f_$dt.npy"
    close "$T/f_$dt.npy" $H/fwd_out_dtype_$dt.npy 1e-5 "forward --dtype $dt"
    descr "$T/f_$dt.npy" "<f4"
    far "$T/f32.npy" $H/fwd_out_dtype_$dt.npy 1e-5 "forward without --dtype"
done
# a bf16 query file: a bf16 output
run "forward on a bf16 query" "$MHA" forward --weights $H/fwd_w.safetensors --heads 3 \
    --query $H/fwd_q_bf16.npy --out "$T/fb.npy"
descr "$T/fb.npy" "<u2"
# its values are those of the bf16-rounded query in float32 compute, rounded to bf16
run "forward on the rounded query" "$MHA" forward --weights $H/fwd_w.safetensors --heads 3 \
    --query $H/fwd_q_bf16.npy --dtype f32 --out "$T/fb2.npy"
if cmp -s "$T/fb.npy" "$T/fb2.npy"; then ok; else ko "forward: bf16 query, --dtype f32 differs"; fi
expect 2 "valid: f32, f16, bf16" "$MHA" forward --weights $H/fwd_w.safetensors --heads 3 \
    --query $H/fwd_q_bf16.npy --dtype f64 --out "$T/fb.npy"

# ---- mha bench --dtype: every JSON line says its dtype, half validated -----------
run "bench" "$MHA" bench --heads 2 --seq 19 --head-dim 8 --json --reps 1
if grep -q '"dtype":"f32"' "$T/stdout"; then ok; else ko "bench: no \"dtype\":\"f32\": $(cat "$T/stdout")"; fi
for dt in bf16 f16; do
    run "bench --dtype $dt" "$MHA" bench --heads 2 --kv-heads 1 --seq 19 --kv-seq 23 \
        --head-dim 8 --json --reps 1 --kernel all --causal --dtype $dt
    n=$(grep -c "\"op\":\"attention\",\"kernel\":\"[a-z0-9]*\",\"dtype\":\"$dt\"" "$T/stdout")
    if [ "$n" -ge 2 ]; then ok; else ko "bench --dtype $dt: $n lines: $(cat "$T/stdout")"; fi
done
run "bench --mha" "$MHA" bench --mha --heads 2 --seq 9 --head-dim 4 --json --reps 1
if grep -q '"op":"mha","kernel":"[a-z0-9]*","dtype":"f32"' "$T/stdout"; then ok
else ko "bench --mha: $(cat "$T/stdout")"; fi

echo "cli-half: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
