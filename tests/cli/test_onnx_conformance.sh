#!/bin/sh
# test_onnx_conformance.sh - ONNX's own Attention backend cases through
# `mha attention`: the committed conversion in tests/onnx/cases (seed 0), and,
# when pyenv's python3 has onnx, a fresh draw of the same cases (inputs in no
# repository; expected values from onnx.reference) - docs/onnx.md.
# Pass rule per output: max|y - ref| <= tol * max(1, max|ref|), tol 1e-4
# float32, 2e-2 float16 (2e-2 bfloat16, stored as float32).
B=${MHA_BUILD:-build}
MHA=$PWD/$B/mha
CMP=$PWD/$B/npycmp
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL $*"; }

# run_cases DIR LABEL: every case folder of DIR
run_cases() {
    n0=$pass; f0=$fail
    for d in "$1"/*/; do
        d=${d%/}; name=$(basename "$d")
        [ -f "$d/args" ] || continue
        tol=$(cat "$d/tol")
        outs=""
        for o in out present_key present_value qk; do
            [ -f "$d/expected_$o.npy" ] || continue
            case $o in
            out) flag=--out ;; present_key) flag=--present-key ;;
            present_value) flag=--present-value ;; qk) flag=--qk-out ;;
            esac
            outs="$outs $flag $T/$o.npy"
        done
        rm -f "$T"/*.npy
        # shellcheck disable=SC2046
        if (cd "$d" && "$MHA" $(cat args) $outs) >"$T/stdout" 2>"$T/stderr"; then
            good=1
            for o in out present_key present_value qk; do
                [ -f "$d/expected_$o.npy" ] || continue
                if ! "$CMP" "$T/$o.npy" "$d/expected_$o.npy" "$tol" >"$T/cmp" 2>&1; then
                    good=0; ko "$2 $name: $o: $(cat "$T/cmp")"
                fi
            done
            [ $good -eq 1 ] && ok
        else
            ko "$2 $name: exit $?: $(cat "$T/stderr")"
        fi
    done
    echo "onnx $2: $((pass - n0)) passed, $((fail - f0)) failed"
}

run_cases tests/onnx/cases committed

if python3 -c "import onnx, numpy" 2>/dev/null; then
    seed=${MHA_ONNX_SEED:-$$}
    if python3 tests/onnx/convert_onnx_cases.py "$T/fresh" --seed "$seed" >"$T/gen" 2>&1; then
        run_cases "$T/fresh" "fresh(seed $seed)"
    else
        ko "convert_onnx_cases.py --seed $seed: $(tail -3 "$T/gen")"
    fi
else
    echo "onnx: python3 has no onnx package: fresh ONNX cases skipped"
fi

# ---- inputs the operator rejects: exit 2 and a message ---------------------------
C=tests/onnx/cases/test_attention_4d
G=tests/onnx/cases/test_attention_4d_with_past_and_present
P=tests/onnx/cases/test_attention_4d_gqa_causal_nonpad_decode
expect() { # expect STATUS NEEDLE CMD...
    st=$1 needle=$2; shift 2
    "$@" >"$T/o" 2>"$T/e"; rc=$?
    if [ $rc -eq "$st" ] && grep -q -- "$needle" "$T/e"; then ok
    else ko "expect $st '$needle': got $rc: $(cat "$T/e") ($*)"; fi
}
Y="--out $T/y.npy"
expect 2 "go together" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --past-key $G/past_key.npy $Y
expect 2 "cannot be combined" "$MHA" attention --q $G/q.npy --k $G/k.npy --v $G/v.npy \
    --past-key $G/past_key.npy --past-value $G/past_value.npy \
    --nonpad-kv-seqlen $P/nonpad.npy $Y
expect 2 "qk-mode" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy --qk-mode 4 $Y
expect 2 "softmax-precision" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --softmax-precision 7 $Y
expect 2 "window-left" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --window-left -2 $Y
expect 2 "q-heads" "$MHA" attention --q tests/onnx/cases/test_attention_3d/q.npy \
    --k tests/onnx/cases/test_attention_3d/k.npy --v tests/onnx/cases/test_attention_3d/v.npy $Y
expect 2 "multiple of" "$MHA" attention --q tests/onnx/cases/test_attention_3d/q.npy \
    --k tests/onnx/cases/test_attention_3d/k.npy --v tests/onnx/cases/test_attention_3d/v.npy \
    --q-heads 5 --kv-heads 3 $Y
expect 2 "kv heads do not divide" "$MHA" attention --q $C/q.npy \
    --k tests/onnx/cases/test_attention_4d_gqa_causal_nonpad_decode/k.npy \
    --v tests/onnx/cases/test_attention_4d_gqa_causal_nonpad_decode/v.npy $Y
expect 2 "longer than" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --mask $G/mask.npy $Y
expect 2 "nonpad_kv_seqlen" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --nonpad-kv-seqlen tests/onnx/cases/test_attention_4d_causal_nonpad_batch_prefill/nonpad.npy $Y
expect 2 "integer" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy \
    --nonpad-kv-seqlen $C/q.npy $Y
expect 2 "one float dtype" "$MHA" attention --q tests/onnx/cases/test_attention_4d_fp16/q.npy \
    --k $C/k.npy --v $C/v.npy $Y
expect 2 "4-D" "$MHA" attention --q $C/q.npy --k $C/k.npy --v $C/v.npy --q-heads 2 $Y

echo "onnx: $pass passed, $fail failed"
[ $fail -eq 0 ]
