#!/bin/sh
# test_cli_io.sh - `mha forward` and `mha attention` from files: committed
# PyTorch/NumPy fixtures (tests/fixtures/cli), fresh random PyTorch modules
# when /usr/bin/python3 has torch, every malformed corpus file (exit 2 and the
# expected message), argument errors, --help, and NumPy reading mha's files.
# Prints "cli-io: N passed, N failed".
. tests/cli/lib/common.sh
CMP=$PWD/$B/npycmp


# run_cases DIR: every case directory under DIR, outputs compared by npycmp
run_cases() {
    for d in "$1"/*/; do
        [ -f "$d/args" ] || continue
        name=$(basename "$d")
        rm -f "$T/y.npy" "$T/a.npy"
        wopt=""
        [ -f "$d/expected_weights.npy" ] && wopt="--attn-weights-out $T/a.npy"
        # shellcheck disable=SC2046,SC2086
        if (cd "$d" && "$MHA" $(cat args) --out "$T/y.npy" $wopt) 2>"$T/stderr"; then
            tol=$(cat "$d/tol")
            if "$CMP" "$T/y.npy" "$d/expected_out.npy" "$tol" >"$T/cmp"; then ok
            else ko "$name: out $(cat "$T/cmp")"; fi
            if [ -n "$wopt" ]; then
                if "$CMP" "$T/a.npy" "$d/expected_weights.npy" "$tol" >"$T/cmp"; then ok
                else ko "$name: weights $(cat "$T/cmp")"; fi
            fi
        else
            ko "$name: exit $?: $(cat "$T/stderr")"
        fi
    done
}

# ---- help ----------------------------------------------------------------------
for c in forward attention; do
    if "$MHA" "$c" --help >"$T/out" 2>&1 && grep -q "usage: mha $c" "$T/out"; then ok
    else ko "mha $c --help"; fi
done

# ---- committed fixtures and fresh random modules --------------------------------
run_cases tests/fixtures/cli
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    seed=${MHA_CLI_SEED:-$$}
    if /usr/bin/python3 tests/fixtures/gen_cli_fixtures.py "$T/random" "$seed" 2>"$T/gen"; then
        run_cases "$T/random"
    else
        ko "gen_cli_fixtures.py $seed: $(tail -3 "$T/gen")"
    fi
else
    echo "cli-io: /usr/bin/python3 has no torch: random PyTorch modules skipped"
fi

# ---- malformed files: exit 2 and the expected message -----------------------------
F=tests/fixtures/cli/fwd_cross_kpm_weights
A=tests/fixtures/cli/attn_gqa_causal
grep -v '^#' tests/corpus/expected.txt | while read -r file status needle; do
    case "$file" in
    npy/*) expect 2 "$needle" "$MHA" attention --q "tests/corpus/$file" --k $A/k.npy \
               --v $A/v.npy --out "$T/x.npy" ;;
    *) expect 2 "$needle" "$MHA" forward --weights "tests/corpus/$file" --heads 2 \
           --query $F/q.npy --out "$T/x.npy" ;;
    esac
    echo "$pass $fail" >"$T/counts"
done
read -r p f <"$T/counts"
pass=$p fail=$f
# the same files as masks and as queries of `mha forward`
expect 2 "--key-padding-mask" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query $F/q.npy --key $F/k.npy --value $F/v.npy \
    --key-padding-mask tests/corpus/npy/big_endian.npy --out "$T/x.npy"
expect 2 "--query" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query tests/corpus/npy/truncated_data.npy --out "$T/x.npy"
[ -f "$T/x.npy" ] && ko "a failed run left its output file" || ok

# ---- argument and shape errors ---------------------------------------------------------
expect 2 "--out is required" "$MHA" forward --weights $F/w.safetensors --heads 2 --query $F/q.npy
expect 2 "--heads" "$MHA" forward --heads two
expect 2 "--masked-rows" "$MHA" forward --masked-rows maybe
expect 2 "unknown" "$MHA" forward --frobnicate
expect 2 "--weights is required" "$MHA" forward --heads 2 --query $F/q.npy --out "$T/x.npy"
expect 2 "nonexistent.npy" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query "$T/nonexistent.npy" --out "$T/x.npy"
expect 2 "--key and --value go together" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query $F/q.npy --key $F/k.npy --out "$T/x.npy"
expect 2 "cannot be mixed" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query $F/q.npy --key tests/fixtures/cli/fwd_unbatched_nobias_amb/k.npy \
    --value tests/fixtures/cli/fwd_unbatched_nobias_amb/v.npy --out "$T/x.npy"
expect 2 "no tensor named 'enc.in_proj_weight'" "$MHA" forward --weights $F/w.safetensors \
    --heads 2 --prefix enc. --query $F/q.npy --out "$T/x.npy"
expect 2 "head" "$MHA" forward --weights $F/w.safetensors --heads 4 --query $F/q.npy \
    --out "$T/x.npy"
expect 2 "key_padding_mask" "$MHA" forward --weights $F/w.safetensors --heads 2 \
    --query $F/q.npy --key-padding-mask $F/q.npy --out "$T/x.npy"
expect 2 "--k is required" "$MHA" attention --q $A/q.npy --v $A/v.npy --out "$T/x.npy"
expect 2 "--scale" "$MHA" attention --q $A/q.npy --k $A/k.npy --v $A/v.npy --scale inf \
    --out "$T/x.npy"
expect 2 "not 4-D" "$MHA" attention --q $F/q.npy --k $A/k.npy --v $A/v.npy --out "$T/x.npy"
expect 2 "mask" "$MHA" attention --q $A/q.npy --k $A/k.npy --v $A/v.npy --mask $F/kpm.npy \
    --out "$T/x.npy"
expect 1 "" "$MHA" attention --q $A/q.npy --k $A/k.npy --v $A/v.npy --out "$T/no/such/dir/y.npy"

# ---- NumPy reads what mha writes, byte for byte as numpy.save --------------------------
if /usr/bin/python3 -c "import numpy" 2>/dev/null; then
    (cd tests/fixtures/cli/attn_f16 && "$MHA" $(cat args) --out "$T/h.npy") &&
    (cd $F && "$MHA" $(cat args) --out "$T/y.npy" --attn-weights-out "$T/a.npy") &&
    if /usr/bin/python3 - "$T" <<'PY'
import io, sys
import numpy as np
t = sys.argv[1]
for name, dt in (('h', np.float16), ('y', np.float32), ('a', np.float32)):
    a = np.load('%s/%s.npy' % (t, name))
    assert a.dtype == dt, (name, a.dtype)
    b = io.BytesIO()
    np.save(b, a)
    assert b.getvalue() == open('%s/%s.npy' % (t, name), 'rb').read(), name
PY
    then ok; else ko "numpy round trip of mha's .npy files"; fi
else
    echo "cli-io: /usr/bin/python3 has no numpy: NumPy round trip skipped"
fi

echo "cli-io: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
